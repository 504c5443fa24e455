"""``raysim tune TUNE.yaml``: search each method's hyperparameters on validation data, rerun the best on
fresh seeds, and print the tuned table (mean ± std, 95 % CI, paired differences) beside the fixed one."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Mapping, Sequence

from raysim.cli.common import format_cell, print_table
from raysim.cli.sweep import add_sweep_options, check_sweep_options, execute_sweep
from raysim.config import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="tune each method on validation data, then compare on fresh seeds "
                                           "with confidence intervals (resumable)")
    p.add_argument("tune", help="tune YAML: base config, contestants, search space, tuning and final seeds")
    add_sweep_options(p)
    p.set_defaults(func=cmd_tune)


def _run_stage(tune: Any, stage: str, runs: Sequence[Any], results_dir: str, args: argparse.Namespace,
               pool: list[Any]) -> dict[str, dict[str, Any] | None]:
    """Run one stage as a sweep: completed and diverged runs are not redone. Returns every run's row.
    The stages share one pool of warm actors: ``pool`` holds its ``KeptPool`` once a stage has run."""
    from raysim.sweep import check_sweep, read_statuses
    from raysim.tune import as_sweep, diverged
    sweep = as_sweep(tune, stage, runs)
    plans = check_sweep(sweep)
    rows = read_statuses(sweep, results_dir)
    todo = [plan for plan in plans
            if (rows[plan.run_id] or {}).get("status") != "completed" and not diverged(rows[plan.run_id])]
    print(f"tune {tune.name}, {stage}: {len(sweep.configs)} runs, {len(sweep.configs) - len(todo)} done, "
          f"{len(todo)} to run", flush=True)
    if todo and not args.dry_run:
        if not pool:
            from raysim.runtime.sweep_runner import KeptPool
            pool.append(KeptPool())
        execute_sweep(sweep, todo, results_dir, args, kept_pool=pool[0])
        rows = read_statuses(sweep, results_dir)
    return rows


def _ci(row: Mapping[str, Any], lo: str, hi: str) -> str:
    a, b = row.get(lo), row.get(hi)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return ""
    return f"[{a:+.4f}, {b:+.4f}]" if lo.startswith("diff") else f"[{a:.4f}, {b:.4f}]"


def print_comparison(tune: Any, table: list[dict[str, Any]], stage: str, title: str) -> None:
    from raysim.tune import summarise
    metric = "test_accuracy" if tune.objective == "accuracy" else "test_f1"
    rows = summarise(table, stage, metric)
    for r in rows:
        r["mean_std"] = "" if math.isnan(r["mean"]) else f"{r['mean']:.4f} ± {format_cell(r['std']) or '—'}"
        r["ci"] = _ci(r, "ci_low", "ci_high")
        if "diff" in r:
            r["delta"] = "" if math.isnan(r["diff"]) else f"{r['diff']:+.4f} {_ci(r, 'diff_low', 'diff_high')}"
            r["adjusted"] = _ci(r, "adj_low", "adj_high")
            r["verdict"] = "yes" if r["significant"] else "no"
        elif r["contestant"] == tune.reference:
            r["delta"] = "reference"
    family = next((r["family"] for r in rows if "family" in r), 0)
    print(f"\n{title}")
    columns = [("contestant", "contestant"), ("chosen", "hyperparameters"), ("seeds", "seeds"),
               ("mean_std", f"test {tune.objective} mean ± std"), ("ci", "95% CI")]
    if tune.reference:
        columns += [("delta", f"paired Δ vs {tune.reference} (95% CI, unadjusted)"),
                    ("adjusted", f"Bonferroni-adjusted CI (m = {family})"), ("verdict", "significant")]
    print_table(rows, columns)
    if tune.reference and family:
        print(f"Significant: the Bonferroni-adjusted interval ({family} comparisons against {tune.reference}, "
              f"each at level 1 − 0.05/{family}) excludes 0; the unadjusted intervals are for one comparison alone.")


def print_candidates(tune: Any, runs: Sequence[Any], rows: Mapping[str, Mapping[str, Any] | None],
                     chosen: Mapping[str, Any]) -> None:
    """Each candidate's mean validation objective ± its standard error, and which one the selection rule chose."""
    from raysim.tune.select import candidate_stats
    stats = candidate_stats(tune, runs, rows)
    print(f"Validation {tune.objective} over tuning seeds {list(tune.tuning_seeds)} (mean ± SE: seeds and hold-out "
          f"images); selection: {tune.selection}")
    for c in tune.contestants:
        if chosen[c.label] is None:
            print(f"  {c.label}: every candidate failed or diverged; no final runs")
            continue
        cells = [f"{cand.label} {s.mean:.4f} ± {s.se:.4f}" + (" *" if cand == chosen[c.label] else "")
                 if math.isfinite(s.mean) else f"{cand.label} failed" for (label, cand), s in stats.items()
                 if label == c.label]
        print(f"  {c.label}: " + "; ".join(cells) + "   (* chosen)")


def privacy_statement(tune: Any, table: list[dict[str, Any]], deltas: Mapping[str, float],
                      uncovered: Mapping[str, str] | None = None) -> str:
    """In words: that the tuning's privacy cost is not counted, or (private mode) what it is. ``deltas``: δ of
    each contestant's runs; ``uncovered``: each contestant's ``not_covered_by_epsilon`` (empty: none)."""
    search = [r for r in table if r["stage"] == "search"]
    gaps = {label: text for label, text in (uncovered or {}).items() if text}
    caveat = ("" if not gaps else " Uploads outside ε stay outside it, tuning or not: "
              + "; ".join(f"{label}: {text}" for label, text in gaps.items()) + ".")
    scopes = {r["contestant"]: r["epsilon_scope"] for r in table if r.get("epsilon_scope")}
    whose = ("" if not scopes else " Whose ε (epsilon_scope): "
             + "; ".join(f"{label}: {scope}" for label, scope in scopes.items()) + ".")
    opted = sorted({f"{r['contestant']}: {r['epsilon_exceptions']}" for r in table if r.get("epsilon_exceptions")})
    if opted:
        caveat += (f" ε does not cover these uploads, which the config opted in to (privacy.allow_uncovered): "
                   f"{'; '.join(opted)}.")
    if not tune.private:
        cands = len({(r["contestant"], r["candidate"]) for r in search})
        return (f"Privacy: each training run's ε (the tuning table's epsilon column) is that run's alone; the tuning's privacy cost is NOT included (the field's common "
                f"practice). {cands} candidate configurations were trained on the clients' data on "
                f"{len(tune.tuning_seeds)} tuning seed(s) ({len(search)} training runs), before the "
                f"{len(tune.final_seeds)} final seeds." + whose + caveat)
    draws = [r for r in table if r["stage"] == "private"]
    worst: dict[str, float] = {}
    for r in draws:
        if math.isfinite(r["released_epsilon"]):
            worst[r["contestant"]] = max(worst.get(r["contestant"], 0.0), r["released_epsilon"])
    parts = [f"{label} ε ≤ {eps:.3f}" + (f" ({scopes[label]})" if label in scopes else "") + f" at δ = {deltas[label]:g}"
             for label, eps in worst.items()]
    return (f"Privacy (private tuning, Papernot & Steinke 2022): on each final seed the number of candidates K was "
            f"drawn from {tune.count.describe()} (E[K] = {tune.count.mean:.2f}; {len(draws)} draws over the "
            f"{len(tune.final_seeds)} final seeds), each trained with its own randomness, and only the best by "
            f"validation was released. ε of the released model, tuning included (largest over the final seeds): "
            + "; ".join(parts) + ". It covers the released model only: the draws' validation scores and test "
            "metrics printed here are not covered." + whose + caveat)


def private_epsilons(tune: Any, runs: Sequence[Any], rows: Mapping[str, Mapping[str, Any] | None]
                     ) -> dict[tuple[str, int], float]:
    """ε of each (contestant, final seed)'s released model, tuning included (0 where K = 0: nothing released).
    The space holds privacy-neutral keys only (``PRIVACY_NEUTRAL_KEYS``), so the drawn candidates' curves
    are every candidate's."""
    from raysim.privacy.tuning import ORDERS, rdp_from_json, tuned_epsilon
    out: dict[tuple[str, int], float] = {}
    for c in tune.contestants:
        for seed in tune.final_seeds:
            curves, drawn = [], False
            for r in runs:
                if r.stage == "private" and r.contestant == c.label and r.seed == seed:
                    raw = (rows.get(r.run_id) or {}).get("rdp_epsilons")
                    drawn = True
                    if raw is not None:   # a diverged draw has none: it released less than a completed one
                        curves.append(rdp_from_json(raw))
            if drawn and not curves:
                raise ConfigError(f"tune contestant {c.label}, seed {seed}: no draw completed, so no RDP curve "
                                  f"bounds the tuning; rerun the tune")
            delta = next(r.cfg.privacy.delta for r in runs if r.contestant == c.label)
            out[(c.label, seed)] = tuned_epsilon(curves, ORDERS, delta, tune.count) if curves else 0.0
    return out


def cmd_tune(args: argparse.Namespace) -> int:
    from raysim.tune import load_tune
    check_sweep_options(args)
    tune = load_tune(args.tune, args.overrides, args.data_root, args.address)
    results_dir = args.results_dir if "://" in args.results_dir else os.path.abspath(args.results_dir)
    pool: list[Any] = []
    try:
        return _tune(args, tune, results_dir, pool)
    finally:
        for kept in pool:
            kept.close()


def _tune(args: argparse.Namespace, tune: Any, results_dir: str, pool: list[Any]) -> int:
    from raysim.results import ResultsSink
    from raysim.sweep import sweep_id_for
    from raysim.tune import choose, edge_choices, final_runs, private_runs, released, search_runs, tuning_rows
    from raysim.tune.select import close_calls
    if tune.private:
        runs = private_runs(tune)
        rows = _run_stage(tune, "private", runs, results_dir, args, pool)
        if args.dry_run:
            return 0
        best = released(tune, runs, rows)
        chosen_ids = {r.run_id for r in best.values() if r is not None}
        chosen_ids |= {r.run_id for r in runs if r.stage == "fixed"}
        epsilons = private_epsilons(tune, runs, rows)
    else:
        runs = search_runs(tune)
        rows = _run_stage(tune, "search", runs, results_dir, args, pool)
        if args.dry_run:
            print(f"tune {tune.name}, final: run after the search ({len(tune.contestants)} contestants × "
                  f"{len(tune.final_seeds)} final seeds, tuned and fixed)")
            return 0
        chosen = choose(tune, runs, rows)
        print_candidates(tune, runs, rows, chosen)
        final = final_runs(tune, chosen)
        rows = {**rows, **_run_stage(tune, "final", final, results_dir, args, pool)}
        chosen_ids = {r.run_id for r in runs if chosen[r.contestant] == r.candidate}
        chosen_ids |= {r.run_id for r in final}
        runs = runs + final
        epsilons = None
    tune_id = sweep_id_for(tune.name, [r.run_id for r in runs])
    table = tuning_rows(tune, tune_id, runs, rows, chosen_ids, epsilons)
    ResultsSink(results_dir).write_tuning(tune_id, table)
    tuned_stage = "private" if tune.private else "final"
    print_comparison(tune, table, tuned_stage,
                     f"Tuned: each contestant at its best candidate on validation ({tune.objective} on the server "
                     f"hold-out), test {tune.objective} over final seeds {list(tune.final_seeds)}")
    print_comparison(tune, table, "fixed", "Fixed: every contestant at the base config's hyperparameters, same seeds")
    edges = edge_choices(table)
    if edges:
        print("\nAt the edge of the search space:\n" + "\n".join(f"  {line}" for line in edges))
    if not tune.private:
        close = close_calls(tune, runs, rows, chosen)
        if close:
            print("\nWithin one standard error of the runner-up:\n" + "\n".join(f"  {line}" for line in close))
    deltas = {r.contestant: r.cfg.privacy.delta for r in runs}
    uncovered = {r.contestant: (rows.get(r.run_id) or {}).get("not_covered_by_epsilon") or "" for r in runs
                 if r.stage == "fixed"}
    print("\n" + privacy_statement(tune, table, deltas, uncovered))
    print(f"\nResults (Parquet, tune_id {tune_id}): {results_dir}/tuning, /runs, /rounds, /clients")
    bad = [r for r in table if r["status"] not in ("completed", "diverged")]
    if bad:
        print(f"{len(bad)} run(s) did not complete; rerun the same command to resume them.", file=sys.stderr)
    return 1 if bad else 0
