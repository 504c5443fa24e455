"""Tune files: each method at its own best hyperparameters, chosen on validation data, then reported
on fresh seeds with confidence intervals.

A tune file::

    name: quickstart                   # optional; default: the file's stem
    base: ../quickstart.yaml           # a config file (relative to this file) or a config mapping
    set: {rounds: 20, data.server_holdout: 200}   # optional dotted overrides of the base
    methods:                           # contestants: a method name, or {label, method, set}
      - fedsa
      - {label: fedsa+lldm, method: feddimdp, set: {feddimdp.adpc: false, feddimdp.cra: false}}
    space:                             # dotted key -> list of values, or {log: [lo, hi], num: n}
      lr: {log: [0.03, 1.0], num: 5}   # default: 5 log-spaced values spanning 30x around the base lr
      privacy.clip_norm: [0.3, 1, 3]   # searched for fixed-clip methods only (not ADPC, not adaptive quantile)
    method_space:                      # optional, per contestant label: keys added to (or replacing) `space`
      feddimdp: {adpc.quantile: [0.5, 0.75]}
    search: grid                       # grid | random (`budget` candidates per contestant, seeded by search_seed)
    tuning_seeds: [100, 101]           # stage 1: every candidate on each of these
    final_seeds: [0, 1, 2, 3, 4]       # stage 2: the chosen candidate (and the base config); disjoint from the above
    objective: accuracy                # accuracy | f1 of the final global model on the validation set
    reference: fedsa                   # paired differences are taken against this contestant
    private: false                     # true: Papernot–Steinke random-count tuning, only the best released

The validation set is the public server hold-out (``data.server_holdout`` > 0, drawn from the training
split before partitioning and owned by no client); the test split is read only by the final report.
Nothing here imports Ray: :mod:`raysim.cli.tune` runs the stages as ordinary sweeps.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from raysim.config import (Config, ConfigError, apply_overrides, cli_overrides, config_from_dict, read_yaml,
                           run_id_for)
from raysim.sweep import Sweep, file_base, sweep_id_for

__all__ = ["Contestant", "Candidate", "TuneSpec", "load_tune", "parse_tune", "candidates", "search_runs",
           "final_runs", "private_runs", "choose", "tuning_rows", "summarise", "mean_ci", "OBJECTIVES"]

_KEYS = ("name", "base", "set", "methods", "space", "method_space", "search", "budget", "search_seed",
         "tuning_seeds", "final_seeds", "objective", "reference", "private", "candidates")
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


# --------------------------------------------------------------------------- parsing

def _flatten(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, Mapping) and not _is_range(value):
            out.extend(_flatten(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _is_range(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and set(value) <= {"log", "linear", "num"}


def _check_space_entry(where: str, key: str, value: Any, search: str) -> None:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"tune {where} '{key}': expected a non-empty list of values")
        return
    if _is_range(value):
        kind = "log" if "log" in value else "linear"
        bounds = value.get(kind)
        if ("log" in value) == ("linear" in value) or not isinstance(bounds, list) or len(bounds) != 2:
            raise ConfigError(f"tune {where} '{key}': expected {{log: [lo, hi], num: n}} or {{linear: [lo, hi], num: n}}")
        lo, hi = (float(b) for b in bounds)
        if not lo < hi or (kind == "log" and lo <= 0):
            raise ConfigError(f"tune {where} '{key}': need {'0 < ' if kind == 'log' else ''}lo < hi, got {bounds}")
        num = value.get("num")
        if search == "grid" and (not isinstance(num, int) or num < 2):
            raise ConfigError(f"tune {where} '{key}': a grid search needs num >= 2 points")
        return
    raise ConfigError(f"tune {where} '{key}': expected a list of values or {{log: [lo, hi], num: n}}, got {value!r}")


def _seeds(raw: Any, key: str, required: bool) -> tuple[int, ...]:
    if raw is None and not required:
        return ()
    if (not isinstance(raw, list) or not raw
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in raw)):
        raise ConfigError(f"tune key '{key}': expected a non-empty list of seeds (integers >= 0), got {raw!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"tune key '{key}': a seed is listed twice")
    return tuple(raw)


def _contestants(raw: Any) -> tuple[Contestant, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("tune key 'methods': expected a non-empty list of method names or {label, method, set}")
    out = []
    for entry in raw:
        if isinstance(entry, str):
            out.append(Contestant(entry, entry))
            continue
        if not isinstance(entry, Mapping) or "method" not in entry or set(entry) - {"label", "method", "set"}:
            raise ConfigError(f"tune methods entry {entry!r}: expected a method name or {{label, method, set}}")
        sets = entry.get("set") or {}
        if not isinstance(sets, Mapping):
            raise ConfigError(f"tune methods entry {entry!r}: `set` must be a mapping of dotted keys")
        out.append(Contestant(str(entry.get("label") or entry["method"]), str(entry["method"]), tuple(_flatten(sets))))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"tune key 'methods': two contestants share a label ({labels}); give each a `label`")
    return tuple(out)


def parse_tune(spec: Mapping[str, Any], *, name: str, base_dir: Path = Path("."),
               overrides: Sequence[tuple[str, Any]] = ()) -> TuneSpec:
    """Validate a parsed tune file (``overrides``: ``--set`` pairs, applied to the base after ``set``)."""
    base = file_base(spec, "tune", _KEYS, base_dir)
    sets = spec.get("set") or {}
    if not isinstance(sets, Mapping):
        raise ConfigError("tune key 'set': expected a mapping of dotted config keys")
    values = apply_overrides(dict(base), _flatten(sets) + list(overrides))
    values.pop("method", None)   # the contestants name the methods
    values.pop("seed", None)     # the stages name the seeds
    contestants = _contestants(spec.get("methods"))
    search = spec.get("search", "grid")
    if search not in ("grid", "random"):
        raise ConfigError(f"tune key 'search': unknown value {search!r}; choose one of grid, random")
    budget = spec.get("budget")
    if search == "random" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError("tune key 'budget': a random search needs budget >= 1 candidates per contestant")
    if search == "grid" and budget is not None:
        raise ConfigError("tune key 'budget': only a random search takes a budget")
    space = spec.get("space") or {}
    if not isinstance(space, Mapping):
        raise ConfigError("tune key 'space': expected a mapping of dotted keys to values")
    common = _flatten(space)
    per = spec.get("method_space") or {}
    if not isinstance(per, Mapping) or set(per) - {c.label for c in contestants}:
        raise ConfigError(f"tune key 'method_space': expected contestant labels as keys "
                          f"({', '.join(c.label for c in contestants)})")
    spaces = {}
    for c in contestants:
        entries = dict(common)
        entries.update(_flatten(per.get(c.label) or {}))
        for key, value in entries.items():
            _check_space_entry("space", key, value, search)
        spaces[c.label] = tuple(entries.items())
    private = spec.get("private", False)
    if not isinstance(private, bool):
        raise ConfigError(f"tune key 'private': expected true/false, got {private!r}")
    tuning_seeds = _seeds(spec.get("tuning_seeds"), "tuning_seeds", required=not private)
    final_seeds = _seeds(spec.get("final_seeds"), "final_seeds", required=True)
    shared = sorted(set(tuning_seeds) & set(final_seeds))
    if shared:
        raise ConfigError(f"tune keys 'tuning_seeds' and 'final_seeds' must be disjoint; both list {shared}")
    objective = spec.get("objective", "accuracy")
    if objective not in OBJECTIVES:
        raise ConfigError(f"tune key 'objective': unknown value {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    reference = spec.get("reference")
    if reference is not None and reference not in {c.label for c in contestants}:
        raise ConfigError(f"tune key 'reference': {reference!r} is not one of the contestants")
    count = None
    if private:
        from raysim.privacy.tuning import CandidateCount
        raw = spec.get("candidates") or {}
        if not isinstance(raw, Mapping):
            raise ConfigError("tune key 'candidates': expected {distribution: ..., ...}")
        try:
            count = CandidateCount.from_mapping(raw, prefix="tune.candidates.")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for label, entries in spaces.items():
            odd = sorted(k for k, _ in entries if k not in PRIVACY_NEUTRAL_KEYS)
            if odd:
                raise ConfigError(f"tune: private tuning searches only keys that leave the privacy plan unchanged "
                                  f"({', '.join(PRIVACY_NEUTRAL_KEYS)}), so that every candidate has the same RDP "
                                  f"curve; contestant {label} searches {odd[0]}")
    elif spec.get("candidates") is not None:
        raise ConfigError("tune key 'candidates': the candidate-count distribution applies with private: true only")
    seed = spec.get("search_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"tune key 'search_seed': expected an integer >= 0, got {seed!r}")
    tune = TuneSpec(str(spec.get("name") or name), values, contestants, spaces, search, budget, seed,
                    tuning_seeds, final_seeds, objective, reference, private, count)
    from raysim.experiment import check_config
    for c in contestants:   # the base config and a candidate of every contestant must be valid before anything runs
        cfg = config_for(tune, c, Candidate(()), final_seeds[0])
        try:
            check_config(cfg)
        except ValueError as exc:
            raise ConfigError(f"tune contestant {c.label}: {exc}") from None
        config_for(tune, c, candidates(tune, c)[0], final_seeds[0])
        if not cfg.data.server_holdout:
            raise ConfigError("tune: the validation set is the public server hold-out; set data.server_holdout > 0 "
                              "in the base or under `set` (e.g. 200 images)")
    return tune


def load_tune(path: str | Path, overrides: Sequence[str] = (), data_root: str | None = None,
              address: str | None = None) -> TuneSpec:
    p = Path(path)
    return parse_tune(read_yaml(p), name=p.stem, base_dir=p.parent,
                      overrides=cli_overrides(tuple(overrides), data_root, address))


# --------------------------------------------------------------------------- configs

def config_for(tune: TuneSpec, contestant: Contestant, candidate: Candidate, seed: int, replicate: int = 0) -> Config:
    values = apply_overrides(tune.base, [("method", contestant.method), *contestant.set, *candidate.values,
                                         ("seed", seed), ("replicate", replicate)])
    try:
        return config_from_dict(values)
    except ConfigError as exc:
        raise ConfigError(f"tune contestant {contestant.label} ({candidate.label}): {exc}") from None


def _fixed_clip(tune: TuneSpec, contestant: Contestant) -> bool:
    """Whether ``privacy.clip_norm`` is a fixed C for this contestant (DP, and not adapted during the run)."""
    from raysim.algorithms.registry import get_method, resolve_preset
    from raysim.privacy.plan import resolve_clipping
    cfg = resolve_preset(config_for(tune, contestant, Candidate(()), tune.final_seeds[0]))
    spec = get_method(cfg.method)
    return resolve_clipping(spec, cfg) != "none" and not spec.adaptive_clip(cfg)


def space_of(tune: TuneSpec, contestant: Contestant) -> list[tuple[str, Any]]:
    """The contestant's search axes: ``lr`` by default (5 log-spaced values spanning 30x around the base
    lr), ``privacy.clip_norm`` only where C is fixed, and every other listed key."""
    entries = dict(tune.spaces[contestant.label])
    if "lr" not in entries:
        lr = config_for(tune, contestant, Candidate(()), tune.final_seeds[0]).lr
        half = math.sqrt(DEFAULT_LR_SPAN)
        entries["lr"] = {"log": [lr / half, lr * half], "num": DEFAULT_LR_POINTS}
    if "privacy.clip_norm" in entries and not _fixed_clip(tune, contestant):
        del entries["privacy.clip_norm"]
    return sorted(entries.items(), key=lambda kv: (kv[0] != "lr", kv[0]))


def _grid_values(entry: Any) -> list[Any]:
    if isinstance(entry, list):
        return list(entry)
    kind = "log" if "log" in entry else "linear"
    lo, hi = (float(b) for b in entry[kind])
    pts = np.geomspace(lo, hi, entry["num"]) if kind == "log" else np.linspace(lo, hi, entry["num"])
    return [float(f"{p:.6g}") for p in pts]


def _draw(entry: Any, rng: np.random.Generator) -> Any:
    if isinstance(entry, list) or "num" in entry:
        values = _grid_values(entry)
        return values[int(rng.integers(len(values)))]
    kind = "log" if "log" in entry else "linear"
    lo, hi = (float(b) for b in entry[kind])
    x = math.exp(rng.uniform(math.log(lo), math.log(hi))) if kind == "log" else rng.uniform(lo, hi)
    return float(f"{x:.6g}")


def candidates(tune: TuneSpec, contestant: Contestant) -> list[Candidate]:
    """The contestant's candidates: the grid, or ``budget`` distinct seeded random draws."""
    axes = space_of(tune, contestant)
    if tune.search == "grid":
        return [Candidate(tuple(zip((k for k, _ in axes), point)))
                for point in itertools.product(*(_grid_values(e) for _, e in axes))]
    from raysim.rng import np_generator
    rng = np_generator(tune.search_seed, "tune-search", 0, tune.contestants.index(contestant))
    found: list[Candidate] = []
    for _ in range(100 * tune.budget):
        cand = Candidate(tuple((k, _draw(e, rng)) for k, e in axes))
        if cand not in found:
            found.append(cand)
        if len(found) == tune.budget:
            break
    return found


@dataclass(frozen=True)
class PlannedRun:
    stage: str                 # search | final | fixed | private
    contestant: str
    candidate: Candidate
    seed: int
    cfg: Config
    draw: int = 0              # private mode: the draw's index (its replicate)

    @property
    def run_id(self) -> str:
        return run_id_for(self.cfg)


def search_runs(tune: TuneSpec) -> list[PlannedRun]:
    """Stage 1: every candidate of every contestant on every tuning seed."""
    return [PlannedRun("search", c.label, cand, s, config_for(tune, c, cand, s))
            for c in tune.contestants for cand in candidates(tune, c) for s in tune.tuning_seeds]


def final_runs(tune: TuneSpec, chosen: Mapping[str, Candidate | None]) -> list[PlannedRun]:
    """Stage 2: each contestant's chosen candidate, and its base config (the fixed-hyperparameter
    comparison), on every final seed."""
    out = []
    for c in tune.contestants:
        for s in tune.final_seeds:
            if chosen.get(c.label) is not None:
                out.append(PlannedRun("final", c.label, chosen[c.label], s, config_for(tune, c, chosen[c.label], s)))
            out.append(PlannedRun("fixed", c.label, Candidate(()), s, config_for(tune, c, Candidate(()), s)))
    return out


def private_runs(tune: TuneSpec) -> list[PlannedRun]:
    """Private mode: on each final seed's federation, K ~ ``candidates`` draws, each drawn uniformly from
    the space and trained with its own randomness (``replicate`` = draw index), only the best released."""
    from raysim.rng import np_generator
    out = []
    for ci, c in enumerate(tune.contestants):
        axes = space_of(tune, c)
        for s in tune.final_seeds:
            rng = np_generator(tune.search_seed, "tune-private", s, ci)
            k = tune.count.sample(rng)
            for j in range(1, k + 1):
                cand = Candidate(tuple((key, _draw(e, rng)) for key, e in axes))
                out.append(PlannedRun("private", c.label, cand, s, config_for(tune, c, cand, s, replicate=j), j))
            out.append(PlannedRun("fixed", c.label, Candidate(()), s, config_for(tune, c, Candidate(()), s)))
    return out


def as_sweep(tune: TuneSpec, stage: str, runs: Sequence[PlannedRun]) -> Sweep:
    """A stage as an ordinary sweep (run once per distinct run id, in order)."""
    configs, seen = [], set()
    for r in runs:
        if r.run_id not in seen:
            seen.add(r.run_id)
            configs.append(r.cfg)
    name = f"{tune.name}-{stage}"
    return Sweep(name, sweep_id_for(name, list(seen)), tuple(configs), len(runs) - len(configs))


# --------------------------------------------------------------------------- choosing and reporting

def diverged(row: Mapping[str, Any] | None) -> bool:
    """A failed run whose training diverged: a result of the candidate (rerunning gives the same bits)."""
    return bool(row) and row.get("status") == "failed" and str(row.get("error") or "").startswith("TrainingDiverged")


def _score(row: Mapping[str, Any] | None, column: str) -> float:
    if not row or row.get("status") != "completed" or row.get(column) is None:
        return math.nan
    value = float(row[column])
    return value if math.isfinite(value) else math.nan


def choose(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None]
           ) -> dict[str, Candidate | None]:
    """Each contestant's best candidate by the mean validation objective over the tuning seeds. A candidate
    with a diverged or failed seed scores as failed; ties go to the first candidate in search order."""
    scores = candidate_scores(tune, runs, rows)
    chosen: dict[str, Candidate | None] = {}
    for c in tune.contestants:
        best, best_score = None, -math.inf
        for (label, cand), score in scores.items():
            if label == c.label and math.isfinite(score) and score > best_score:
                best, best_score = cand, score
        chosen[c.label] = best
    return chosen


def candidate_scores(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None]
                     ) -> dict[tuple[str, Candidate], float]:
    per: dict[tuple[str, Candidate], list[float]] = {}
    for r in runs:
        per.setdefault((r.contestant, r.candidate), []).append(_score(rows.get(r.run_id), tune.objective_column))
    return {key: (float(np.mean(v)) if all(math.isfinite(x) for x in v) else math.nan) for key, v in per.items()}


def released(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None]
             ) -> dict[tuple[str, int], PlannedRun | None]:
    """Private mode: the released draw of each (contestant, seed), the best by validation objective
    (ties: the first draw); None when no draw completed (or K was 0)."""
    best: dict[tuple[str, int], tuple[float, PlannedRun | None]] = {}
    for r in runs:
        if r.stage != "private":
            continue
        score = _score(rows.get(r.run_id), tune.objective_column)
        key = (r.contestant, r.seed)
        if key not in best or (math.isfinite(score) and (best[key][1] is None or score > best[key][0])):
            best[key] = (score, r if math.isfinite(score) else best.get(key, (math.nan, None))[1])
    out = {}
    for c in tune.contestants:
        for s in tune.final_seeds:
            out[(c.label, s)] = best.get((c.label, s), (math.nan, None))[1]
    return out


def tuning_rows(tune: TuneSpec, tune_id: str, runs: Sequence[PlannedRun],
                rows: Mapping[str, Mapping[str, Any] | None], chosen_ids: set[str],
                released_epsilons: Mapping[tuple[str, int], float] | None = None) -> list[dict[str, Any]]:
    """The ``tuning`` table: one row per planned run (candidate, stage, seed, objective, chosen).
    ``released_epsilons``: private mode, ε of each (contestant, seed)'s released model, tuning included."""
    scores = candidate_scores(tune, [r for r in runs if r.stage == "search"], rows)
    out = []
    for r in runs:
        row = rows.get(r.run_id) or {}
        status = "diverged" if diverged(row) else (row.get("status") or "missing")
        label = r.candidate.label
        if r.stage == "fixed":   # the base config's values of the searched keys
            label = "base: " + " ".join(f"{k}={_fmt(_value(r.cfg, k))}" for k, _ in space_of(tune, tune.contestant(r.contestant)))
        out.append({
            "tune_id": tune_id, "tune_name": tune.name, "contestant": r.contestant, "method": r.cfg.method,
            "stage": r.stage, "candidate": label, "params": json.dumps(r.candidate.as_dict(), sort_keys=True),
            "lr": float(r.cfg.lr), "clip_norm": float(r.cfg.privacy.clip_norm), "seed": r.seed, "draw": r.draw,
            "run_id": r.run_id, "status": status, "objective_name": tune.objective,
            "objective": _score(row, tune.objective_column),
            "candidate_objective": scores.get((r.contestant, r.candidate), math.nan) if r.stage == "search" else math.nan,
            "test_accuracy": _score(row, "final_test_accuracy"), "test_f1": _score(row, "final_test_f1"),
            "epsilon": _score(row, "epsilon"), "epsilon_exceptions": row.get("epsilon_exceptions") or "",
            "released_epsilon": (released_epsilons or {}).get((r.contestant, r.seed), math.nan)
            if r.stage == "private" else math.nan,
            "reference": tune.reference, "private": tune.private, "chosen": r.run_id in chosen_ids,
        })
    return out


def edge_choices(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per searched key whose chosen value is the smallest or largest of the (at least 3) values
    searched for that contestant: the optimum may lie outside the space."""
    search = [r for r in table if r["stage"] == "search"]
    out = []
    for label in dict.fromkeys(r["contestant"] for r in search):
        mine = [json.loads(r["params"]) for r in search if r["contestant"] == label]
        picked = next((json.loads(r["params"]) for r in search if r["contestant"] == label and r["chosen"]), None)
        for key, value in sorted((picked or {}).items()):
            seen = sorted({p[key] for p in mine if isinstance(p.get(key), (int, float))})
            if len(seen) < 3 or not isinstance(value, (int, float)) or seen[0] < value < seen[-1]:
                continue
            end, side = ("smallest", "below") if value == seen[0] else ("largest", "above")
            out.append(f"{label}: the chosen {key}={_fmt(value)} is the {end} of the {len(seen)} values searched; "
                       f"the optimum may lie {side} it (widen the space)")
    return out


def _value(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, sample std, CI low, CI high): Student's t interval over the seeds (NaN-free input;
    the interval is NaN for fewer than 2 values)."""
    from scipy import stats
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan,) * 4
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan, math.nan
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * std / math.sqrt(x.size)
    return mean, std, mean - half, mean + half


def summarise(table: Sequence[Mapping[str, Any]], stage: str, metric: str = "test_accuracy"
              ) -> list[dict[str, Any]]:
    """Per contestant of a tune's ``tuning`` rows: mean ± std and 95 % CI of ``metric`` over the final
    seeds for ``stage`` (``final``/``private``: tuned; ``fixed``: base config), and the paired difference
    to the tune's reference contestant over the seeds both completed (same seeds, same partitions)."""
    def reported(r: Mapping[str, Any]) -> bool:   # private mode reports the released draw only
        return r["stage"] == stage and (stage != "private" or bool(r["chosen"]))

    def per_seed(label: str) -> dict[int, float]:
        return {int(r["seed"]): float(r[metric]) for r in table
                if r["contestant"] == label and reported(r) and math.isfinite(r[metric])}
    labels = list(dict.fromkeys(r["contestant"] for r in table))
    reference = next((r["reference"] for r in table if r.get("reference")), None)
    out = []
    ref = per_seed(reference) if reference else {}
    for label in labels:
        got = per_seed(label)
        mean, std, lo, hi = mean_ci(list(got.values()))
        chosen = sorted({r["candidate"] for r in table if r["contestant"] == label and reported(r)})
        method = next(r["method"] for r in table if r["contestant"] == label)
        row = {"contestant": label, "method": method, "chosen": "; ".join(chosen), "seeds": len(got), "mean": mean,
               "std": std, "ci_low": lo, "ci_high": hi}
        if reference and label != reference:
            both = sorted(set(got) & set(ref))
            d_mean, _, d_lo, d_hi = mean_ci([got[s] - ref[s] for s in both])
            row.update(diff=d_mean, diff_low=d_lo, diff_high=d_hi, paired=len(both))
        out.append(row)
    return out
