"""Choosing each contestant's candidate from the search stage's rows (and, in private mode, the released draw)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from raysim.tune.plan import PlannedRun, config_for, config_value
from raysim.tune.spec import Candidate, TuneSpec
from raysim.tune.stats import objective_se


def diverged(row: Mapping[str, Any] | None) -> bool:
    """A failed run whose training diverged (the runs table's ``diverged``, set from the exception's type,
    ``raysim.simulation.TrainingDiverged``): a result of the candidate, rerunning gives the same bits."""
    return bool(row) and row.get("status") == "failed" and row.get("diverged") is True


def _score(row: Mapping[str, Any] | None, column: str) -> float:
    if not row or row.get("status") != "completed" or row.get(column) is None:
        return math.nan
    value = float(row[column])
    return value if math.isfinite(value) else math.nan


#: How a contestant's candidate is chosen from the search stage (the tune key ``selection``):
#: ``best`` the highest mean validation objective; ``one_se`` the one-standard-error rule, among the candidates
#: whose mean is within one SE (:func:`raysim.tune.stats.objective_se`) of the best, the one nearest the base
#: config (log distance of the searched numbers), so that a difference the validation noise cannot resolve does
#: not move the choice away from the base (docs/tuning.md measures both).
SELECTIONS = ("one_se", "best")


@dataclass(frozen=True)
class CandidateScore:
    mean: float          # mean validation objective over the tuning seeds (NaN: a seed failed or diverged)
    se: float            # its standard error (objective_se): seeds and hold-out images
    seeds: int


def candidate_stats(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None]
                    ) -> dict[tuple[str, Candidate], CandidateScore]:
    """Per (contestant, candidate) of the search stage: mean objective, its SE, and the seed count."""
    per: dict[tuple[str, Candidate], list[float]] = {}
    holdout: dict[tuple[str, Candidate], int] = {}
    for r in runs:
        key = (r.contestant, r.candidate)
        per.setdefault(key, []).append(_score(rows.get(r.run_id), tune.objective_column))
        holdout[key] = int(r.cfg.data.server_holdout or 0)
    out = {}
    for key, v in per.items():
        if all(math.isfinite(x) for x in v):
            out[key] = CandidateScore(float(np.mean(v)), objective_se(v, holdout[key]), len(v))
        else:
            out[key] = CandidateScore(math.nan, math.nan, len(v))
    return out


def candidate_scores(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None]
                     ) -> dict[tuple[str, Candidate], float]:
    return {key: s.mean for key, s in candidate_stats(tune, runs, rows).items()}


def _distance_to_base(tune: TuneSpec, label: str, cand: Candidate) -> float:
    base = config_for(tune, tune.contestant(label), Candidate(()), tune.final_seeds[0])
    total = 0.0
    for key, value in cand.values:
        ref = config_value(base, key)
        if isinstance(value, (int, float)) and isinstance(ref, (int, float)) and value > 0 and ref > 0:
            total += abs(math.log(value / ref))
        elif value != ref:
            total += 1.0
    return total


def choose(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None],
           selection: str | None = None) -> dict[str, Candidate | None]:
    """Each contestant's candidate by ``selection`` (default: the tune's, see :data:`SELECTIONS`). A candidate
    with a diverged or failed seed scores as failed; ties go to the first candidate in search order."""
    rule = selection or tune.selection
    if rule not in SELECTIONS:
        raise ValueError(f"unknown selection {rule!r}; choose one of {', '.join(SELECTIONS)}")
    stats = candidate_stats(tune, runs, rows)
    chosen: dict[str, Candidate | None] = {}
    for c in tune.contestants:
        mine = [(cand, s) for (label, cand), s in stats.items() if label == c.label and math.isfinite(s.mean)]
        if not mine:
            chosen[c.label] = None
            continue
        best, top = max(mine, key=lambda cs: cs[1].mean)   # max keeps the first of equal means
        if rule == "one_se" and math.isfinite(top.se):
            near = [(cand, s) for cand, s in mine if s.mean >= top.mean - top.se]
            best = min(near, key=lambda cs: (_distance_to_base(tune, c.label, cs[0]), -cs[1].mean))[0]
        chosen[c.label] = best
    return chosen


def close_calls(tune: TuneSpec, runs: Sequence[PlannedRun], rows: Mapping[str, Mapping[str, Any] | None],
                chosen: Mapping[str, Candidate | None]) -> list[str]:
    """One line per contestant whose chosen candidate is within one SE of the best other candidate: the
    search cannot tell them apart on this validation set."""
    stats = candidate_stats(tune, runs, rows)
    out = []
    for c in tune.contestants:
        pick = chosen.get(c.label)
        if pick is None:
            continue
        mine = stats[(c.label, pick)]
        others = [(cand, s) for (label, cand), s in stats.items()
                  if label == c.label and cand != pick and math.isfinite(s.mean)]
        if not others:
            continue
        rival, rs = max(others, key=lambda cs: cs[1].mean)
        if abs(mine.mean - rs.mean) <= mine.se:
            out.append(f"{c.label}: the chosen {pick.label} ({mine.mean:.4f} ± {mine.se:.4f} SE) is within one "
                       f"standard error of {rival.label} ({rs.mean:.4f}); the search does not resolve them")
    return out


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
