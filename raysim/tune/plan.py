"""What a tune runs: each candidate's config, the search space, and the runs of each stage as sweeps."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from raysim.config import Config, ConfigError, apply_overrides, config_from_dict, dotted_get
from raysim.run_plan import run_id_for
from raysim.sweep import Sweep, sweep_id_for
from raysim.tune.spec import DEFAULT_LR_POINTS, DEFAULT_LR_SPAN, Candidate, Contestant, TuneSpec

def config_for(tune: TuneSpec, contestant: Contestant, candidate: Candidate, seed: int, replicate: int = 0) -> Config:
    values = apply_overrides(tune.base, [("method", contestant.method), *contestant.set, *candidate.values,
                                         ("seed", seed), ("replicate", replicate)])
    try:
        return config_from_dict(values)
    except ConfigError as exc:
        raise ConfigError(f"tune contestant {contestant.label} ({candidate.label}): {exc}") from None


def _fixed_clip(tune: TuneSpec, contestant: Contestant) -> bool:
    """Whether ``privacy.clip_norm`` is a fixed C for this contestant (DP, and not adapted during the run)."""
    from raysim.run_plan import plan_run
    plan = plan_run(config_for(tune, contestant, Candidate(()), tune.final_seeds[0]))
    return plan.clipping != "none" and not plan.spec.adaptive_clip(plan.cfg)


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
    configs, seen = [], {}   # run ids in order
    for r in runs:
        if r.run_id not in seen:
            seen[r.run_id] = None
            configs.append(r.cfg)
    name = f"{tune.name}-{stage}"
    return Sweep(name, sweep_id_for(name, list(seen)), tuple(configs), tuple(seen), len(runs) - len(configs))


def config_value(cfg: Config, dotted: str) -> Any:
    """The value of the dotted key ``dotted`` in ``cfg`` (method sections are attributes too)."""
    return dotted_get(cfg, dotted)
