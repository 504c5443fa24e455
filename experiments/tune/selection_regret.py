"""Selection regret of a tune's selection rules: every candidate rerun on the final seeds.

For each contestant of the tune file, every candidate of the search space is trained on the tuning seeds
(the search stage, as ``raysim tune`` runs it) and, for this measurement only, on every final seed too.
For each selection rule (``raysim.tune.select.SELECTIONS``) and each non-empty subset of the tuning seeds
(a search on one seed, on the other, on both), the regret of the pick is how far its mean test objective
over the final seeds falls below the best candidate's. The runs go into ``--results-dir``
with the run ids ``raysim tune`` uses, so ``raysim tune TUNE --results-dir DIR`` afterwards prints the
tune's own tables from them without training again. Runs already completed there are not redone.

    python experiments/tune/selection_regret.py experiments/tune/quickstart.yaml --results-dir results/regret
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math

import numpy as np

from raysim.run_plan import run_id_for
from raysim.results import read_table
from raysim.runtime import execute
from raysim.tune import Candidate, candidates, choose, config_for, load_tune, search_runs
from raysim.tune.select import SELECTIONS, candidate_stats
from raysim.tune.stats import mean_ci


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tune")
    p.add_argument("--results-dir", required=True)
    p.add_argument("--contestants", nargs="*", help="measure only these contestants (default: all)")
    p.add_argument("--final-seeds", type=int, help="use only the first N final seeds (default: all)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tune = load_tune(args.tune, ["runtime.executor=serial"])
    if args.contestants:
        tune = dataclasses.replace(tune, contestants=tuple(c for c in tune.contestants if c.label in args.contestants))
    if args.final_seeds:
        tune = dataclasses.replace(tune, final_seeds=tune.final_seeds[:args.final_seeds])
    search = search_runs(tune)
    every = [config_for(tune, c, cand, s) for s in tune.final_seeds for c in tune.contestants
             for cand in candidates(tune, c)]   # seed by seed: an interrupted measurement covers every candidate
    try:
        done = set(read_table(args.results_dir, "runs").query("status == 'completed'")["run_id"])
    except (FileNotFoundError, ValueError):
        done = set()
    for cfg in [r.cfg for r in search] + every:
        if run_id_for(cfg) not in done:
            execute(cfg, args.results_dir)
            done.add(run_id_for(cfg))
    runs = read_table(args.results_dir, "runs").set_index("run_id")
    rows = {rid: runs.loc[rid].to_dict() if rid in runs.index else None for rid in {r.run_id for r in search}}
    stats = candidate_stats(tune, search, rows)
    subsets = [sub for k in range(1, len(tune.tuning_seeds) + 1) for sub in itertools.combinations(tune.tuning_seeds, k)]
    picks = {(rule, sub): choose(tune, [r for r in search if r.seed in sub], rows, rule)
             for rule in SELECTIONS for sub in subsets}
    out = []
    for c in tune.contestants:
        test = {}
        for cand in candidates(tune, c):
            ids = [run_id_for(config_for(tune, c, cand, s)) for s in tune.final_seeds]
            test[cand] = mean_ci([float(runs.loc[i, tune.test_column]) for i in ids])
        best = max(test, key=lambda k: test[k][0])
        base = config_for(tune, c, Candidate(()), tune.final_seeds[0])
        row = {"contestant": c.label, "base_lr": base.lr,
               "candidates": [{"candidate": k.label, "val_mean": stats[(c.label, k)].mean,
                               "val_se": stats[(c.label, k)].se, "test_mean": v[0], "test_std": v[1]}
                              for k, v in test.items()],
               "best_candidate": best.label, "best_test_mean": test[best][0]}
        for (rule, sub), chosen in picks.items():
            pick = chosen[c.label]
            row.setdefault(rule, []).append({"tuning_seeds": list(sub), "pick": pick.label if pick else None,
                                             "regret": test[best][0] - test[pick][0] if pick else math.nan})
        out.append(row)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for row in out:
        print(f"\n{row['contestant']} (base lr {row['base_lr']:g}); final seeds {list(tune.final_seeds)}")
        print("| candidate | validation mean ± SE | final-seed test mean ± std |\n|---|---|---|")
        for k in row["candidates"]:
            print(f"| {k['candidate']} | {k['val_mean']:.4f} ± {k['val_se']:.4f} | {k['test_mean']:.4f} ± "
                  f"{k['test_std']:.4f} |")
        print("| selection | tuning seeds | pick | regret |\n|---|---|---|---|")
        for rule in SELECTIONS:
            for entry in row[rule]:
                print(f"| {rule} | {entry['tuning_seeds']} | {entry['pick']} | {entry['regret']:.4f} |")
    regrets = {rule: float(np.mean([e["regret"] for row in out for e in row[rule]])) for rule in SELECTIONS}
    print("\nmean regret over contestants and tuning-seed subsets: "
          + ", ".join(f"{rule} {v:.4f}" for rule, v in regrets.items()))


if __name__ == "__main__":
    main()
