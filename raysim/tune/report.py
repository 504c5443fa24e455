"""The ``tuning`` table's rows and the summaries printed from them."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from raysim.tune.plan import PlannedRun, config_value, space_of
from raysim.tune.select import _score, candidate_scores, diverged
from raysim.tune.spec import TuneSpec, _fmt
from raysim.tune.stats import adjust_p, bonferroni_ci, mean_ci, paired_t

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
            label = "base: " + " ".join(f"{k}={_fmt(config_value(r.cfg, k))}" for k, _ in space_of(tune, tune.contestant(r.contestant)))
        out.append({
            "tune_id": tune_id, "tune_name": tune.name, "contestant": r.contestant, "method": r.cfg.method,
            "stage": r.stage, "candidate": label, "params": json.dumps(r.candidate.as_dict(), sort_keys=True),
            "lr": float(r.cfg.lr), "clip_norm": float(r.cfg.privacy.clip_norm), "seed": r.seed, "draw": r.draw,
            "run_id": r.run_id, "status": status, "objective_name": tune.objective,
            "objective": _score(row, tune.objective_column),
            "candidate_objective": scores.get((r.contestant, r.candidate), math.nan) if r.stage == "search" else math.nan,
            "test_accuracy": _score(row, "final_test_accuracy"), "test_f1": _score(row, "final_test_f1"),
            "epsilon": _score(row, "epsilon"), "epsilon_scope": row.get("epsilon_scope") or "",
            "epsilon_exceptions": row.get("epsilon_exceptions") or "",
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


def summarise(table: Sequence[Mapping[str, Any]], stage: str, metric: str = "test_accuracy",
              adjustment: str = "bonferroni", level: float = 0.95) -> list[dict[str, Any]]:
    """Per contestant of a tune's ``tuning`` rows: mean ± std and 95 % CI of ``metric`` over the final
    seeds for ``stage`` (``final``/``private``: tuned; ``fixed``: base config), and the paired difference
    to the tune's reference contestant over the seeds both completed (same seeds, same partitions): its
    unadjusted 95 % interval, the interval adjusted for the family of comparisons against the reference
    (Bonferroni: each at level 1 − 0.05/m for m comparisons), the paired t-test's p-value and its Holm-adjusted
    value. ``significant``: the adjusted interval excludes 0."""
    if adjustment != "bonferroni":
        raise ValueError(f"the adjusted interval is Bonferroni's; got adjustment={adjustment!r}")

    def reported(r: Mapping[str, Any]) -> bool:   # private mode reports the released draw only
        return r["stage"] == stage and (stage != "private" or bool(r["chosen"]))

    def per_seed(label: str) -> dict[int, float]:
        return {int(r["seed"]): float(r[metric]) for r in table
                if r["contestant"] == label and reported(r) and math.isfinite(r[metric])}
    labels = list(dict.fromkeys(r["contestant"] for r in table))
    reference = next((r["reference"] for r in table if r.get("reference")), None)
    out = []
    ref = per_seed(reference) if reference else {}
    diffs: dict[str, list[float]] = {}
    for label in labels:
        got = per_seed(label)
        mean, std, lo, hi = mean_ci(list(got.values()), level)
        chosen = sorted({r["candidate"] for r in table if r["contestant"] == label and reported(r)})
        method = next(r["method"] for r in table if r["contestant"] == label)
        row = {"contestant": label, "method": method, "chosen": "; ".join(chosen), "seeds": len(got), "mean": mean,
               "std": std, "ci_low": lo, "ci_high": hi}
        if reference and label != reference:
            both = sorted(set(got) & set(ref))
            diffs[label] = [got[s] - ref[s] for s in both]
            d_mean, _, d_lo, d_hi = mean_ci(diffs[label], level)
            row.update(diff=d_mean, diff_low=d_lo, diff_high=d_hi, paired=len(both), p=paired_t(diffs[label])[1])
        out.append(row)
    family = [label for label, d in diffs.items() if len(d) >= 2]
    holm = dict(zip(family, adjust_p([paired_t(diffs[label])[1] for label in family], "holm")))
    for row in out:
        if row["contestant"] in diffs:
            label = row["contestant"]
            lo, hi = bonferroni_ci(diffs[label], len(family), level) if label in holm else (math.nan, math.nan)
            row.update(adj_low=lo, adj_high=hi, p_holm=holm.get(label, math.nan), family=len(family),
                       adjustment=adjustment, significant=bool(math.isfinite(lo) and (lo > 0 or hi < 0)))
    return out
