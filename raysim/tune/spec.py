"""A tune's parsed form: contestants, candidates, the spec, and the names of its objectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_KEYS = ("name", "base", "set", "methods", "space", "method_space", "search", "budget", "search_seed",
         "tuning_seeds", "final_seeds", "objective", "reference", "private", "candidates", "selection")
#: objective name -> the runs-table column it reads (validation set, never the test split)
OBJECTIVES = {"accuracy": "final_val_accuracy", "f1": "final_val_f1"}
#: test metric reported for each objective
TEST_METRICS = {"accuracy": "final_test_accuracy", "f1": "final_test_f1"}
#: Keys a private tune may search: none changes σ, the sample rates or the step counts, so every candidate of
#: a contestant has the same RDP curve, and the drawn candidates' curves bound every candidate's.
PRIVACY_NEUTRAL_KEYS = ("lr", "momentum", "privacy.clip_norm")
DEFAULT_LR_SPAN = 30.0
DEFAULT_LR_POINTS = 5


@dataclass(frozen=True)
class Contestant:
    label: str
    method: str
    set: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Candidate:
    """One point of a contestant's search space (dotted key -> value)."""

    values: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={_fmt(v)}" for k, v in self.values) or "base"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class TuneSpec:
    name: str
    base: dict[str, Any]                # base config values with `set` and --set applied
    contestants: tuple[Contestant, ...]
    spaces: dict[str, tuple[tuple[str, Any], ...]]   # contestant label -> (key, raw space entry)
    search: str
    budget: int | None
    search_seed: int
    tuning_seeds: tuple[int, ...]
    final_seeds: tuple[int, ...]
    objective: str
    reference: str | None
    private: bool
    count: Any = None                   # raysim.privacy.tuning.CandidateCount in private mode
    selection: str = "one_se"           # raysim.tune.select.SELECTIONS

    @property
    def objective_column(self) -> str:
        return OBJECTIVES[self.objective]

    @property
    def test_column(self) -> str:
        return TEST_METRICS[self.objective]

    def contestant(self, label: str) -> Contestant:
        return next(c for c in self.contestants if c.label == label)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
