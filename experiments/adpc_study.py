"""What each FedDimDP component adds, on the offline quickstart (the switches and presets of docs/methods.md).

Runs, for each seed, on experiments/quickstart.yaml (digits, 10 clients, α = 0.3, ε = 8, 20 rounds):

* all 8 combinations of ``feddimdp.{lldm,adpc,cra}`` (000 is FedSA; the additive ladder is
  000 → 100 → 101 → 111; the paper's subtractive ablations are 011, 101, 110);
* ``fedsa`` itself (must equal 000 bit for bit) and ``dp-fedavg-adaptive``;
* full FedDimDP with ``cra.utility=server_val_f1`` on a public hold-out, next to ``local_val_f1`` on the
  same partition (the hold-out removed in both);
* full FedDimDP with ``adpc.quantile`` ∈ {0.1, 0.25, 0.75} (0.5 is the default run above);
* full FedDimDP with ``adpc.histogram_noise_multiplier`` σ_h ∈ {5, 10} (25 is the default).

Runs execute with the serial executor, ``--jobs`` at a time, and are skipped when the results folder
already holds them completed. Then the tables (mean ± std over seeds of the final test accuracy) are
printed as Markdown, with C^(t) next to the clients' true per-example norm medians.

    python experiments/adpc_study.py --results-dir /tmp/adpc-study [--seeds 0 1 2] [--jobs 2]
    python experiments/adpc_study.py --results-dir /tmp/adpc-study --report-only
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
HOLDOUT = 150     # ≈ 10 % of digits' 1,438 training images (500 would take a third of them)


def _switches(lldm: bool, adpc: bool, cra: bool) -> dict:
    return {"method": "feddimdp", "feddimdp": {"lldm": lldm, "adpc": adpc, "cra": cra}}


def variants() -> dict[str, dict]:
    out = {}
    for lldm, adpc, cra in itertools.product([False, True], repeat=3):
        out[f"feddimdp {int(lldm)}{int(adpc)}{int(cra)}"] = _switches(lldm, adpc, cra)
    out["fedsa"] = {"method": "fedsa"}
    out["dp-fedavg-adaptive"] = {"method": "dp-fedavg-adaptive"}
    out["feddimdp local_val_f1 (holdout)"] = {**_switches(True, True, True), "data": {"server_holdout": HOLDOUT}}
    out["feddimdp server_val_f1"] = {**_switches(True, True, True), "cra": {"utility": "server_val_f1"},
                                     "data": {"server_holdout": HOLDOUT}}
    for q in (0.1, 0.25, 0.75):
        out[f"feddimdp quantile {q}"] = {**_switches(True, True, True), "adpc": {"quantile": q}}
    for sigma_h in (5.0, 10.0):
        out[f"feddimdp sigma_h {sigma_h:g}"] = {**_switches(True, True, True), "adpc": {"histogram_noise_multiplier": sigma_h}}
    return out


def _config(changes: dict, seed: int):
    from raysim.config import apply_overrides, config_from_dict, read_yaml
    values = read_yaml(QUICKSTART)
    pairs = [("seed", seed), ("runtime.executor", "serial")]
    for key, value in changes.items():
        if isinstance(value, dict):
            pairs += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            pairs.append((key, value))
    return config_from_dict(apply_overrides(values, pairs))


def _run_one(label: str, seed: int, results_dir: str) -> tuple[str, int, str, float]:
    from raysim.runtime import execute
    cfg = _config(variants()[label], seed)
    t0 = time.perf_counter()
    summary = execute(cfg, results_dir)
    return label, seed, summary.run_id, time.perf_counter() - t0


def run_all(results_dir: str, seeds: list[int], jobs: int) -> dict[tuple[str, int], str]:
    from raysim.config import run_id_for
    from raysim.results import ResultsSink
    sink = ResultsSink(results_dir)
    ids, todo = {}, []
    for label in variants():
        for seed in seeds:
            run_id = run_id_for(_config(variants()[label], seed))
            ids[(label, seed)] = run_id
            row = sink.read_run(run_id)
            if not (row and row.get("status") == "completed"):
                todo.append((label, seed))
    print(f"{len(ids)} runs, {len(todo)} to do, {jobs} at a time", file=sys.stderr)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_run_one, label, seed, results_dir) for label, seed in todo]
        for i, fut in enumerate(as_completed(futures), 1):
            label, seed, run_id, secs = fut.result()
            print(f"[{i}/{len(todo)}] {label} seed {seed}: {run_id} ({secs:.0f} s)", file=sys.stderr)
    return ids


def _pm(values: pd.Series) -> str:
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values.mean():.3f}"


def report(results_dir: str, ids: dict[tuple[str, int], str]) -> str:
    from raysim.results import read_table
    runs = read_table(results_dir, "runs").set_index("run_id")
    rounds = read_table(results_dir, "rounds")
    clients = read_table(results_dir, "clients")
    rows = []
    for (label, seed), run_id in ids.items():
        if run_id not in runs.index or runs.loc[run_id, "status"] != "completed":
            continue
        r = runs.loc[run_id]
        rr = rounds[rounds["run_id"] == run_id].sort_values("round")
        rows.append({"variant": label, "seed": seed, "acc": r["final_test_accuracy"], "f1": r["final_test_f1"],
                     "best": r["best_test_accuracy"], "eps": r["epsilon"], "final_C": rr["clip_norm"].iloc[-1]})
    df = pd.DataFrame(rows)
    out = []

    def table(title: str, labels: list[tuple[str, str]]) -> None:
        out.append(f"\n### {title}\n\n| configuration | final accuracy | final macro-F1 | best accuracy | C at round 20 | seeds |\n"
                   "|---|---|---|---|---|---|")
        for label, shown in labels:
            g = df[df["variant"] == label]
            if len(g):
                out.append(f"| {shown} | {_pm(g['acc'])} | {_pm(g['f1'])} | {_pm(g['best'])} | {_pm(g['final_C'])} | {len(g)} |")

    table("Additive ladder (from FedSA upward)", [
        ("fedsa", "fedsa"), ("feddimdp 000", "feddimdp, all switches off (= FedSA)"),
        ("feddimdp 100", "+ LLDM"), ("feddimdp 101", "+ LLDM + CRA (`feddimdp-no-adpc`)"),
        ("feddimdp 111", "+ LLDM + CRA + ADPC (FedDimDP)")])
    table("The paper's subtractive ablations", [
        ("feddimdp 111", "FedDimDP"), ("feddimdp 011", "w/o LLDM"), ("feddimdp 101", "w/o ADPC"),
        ("feddimdp 110", "w/o CRA")])
    table("All 8 switch combinations (lldm adpc cra)", [(f"feddimdp {k}", k) for k in
                                                         ("000", "001", "010", "011", "100", "101", "110", "111")])
    table(f"CRA's utility signal (both on the same partition, {HOLDOUT} training images held out)", [
        ("feddimdp local_val_f1 (holdout)", "`cra.utility=local_val_f1`"),
        ("feddimdp server_val_f1", "`cra.utility=server_val_f1`")])
    table("ADPC's quantile", [("feddimdp quantile 0.1", "0.1"), ("feddimdp quantile 0.25", "0.25"),
                              ("feddimdp 111", "0.5 (default)"), ("feddimdp quantile 0.75", "0.75")])
    table("ADPC's histogram noise σ_h (ε = 8 in all; less histogram noise leaves more DP-SGD noise)", [
        ("feddimdp sigma_h 5", "σ_h = 5"), ("feddimdp sigma_h 10", "σ_h = 10"), ("feddimdp 111", "σ_h = 25 (default)")])
    table("Reference", [("dp-fedavg-adaptive", "dp-fedavg-adaptive"), ("fedsa", "fedsa")])

    # C^(t) next to the true medians (seed 0 of each ADPC variant).
    out.append("\n### C^(t) next to the clients' per-example norm medians (seed 0)\n\n"
               "| variant | round | C^(t) | private median (median over clients) | true median (min / median / max over clients) |\n"
               "|---|---|---|---|---|")
    for label in ("feddimdp 111", "feddimdp 010", "feddimdp quantile 0.1", "feddimdp sigma_h 5"):
        run_id = ids.get((label, 0))
        if run_id is None:
            continue
        rr = rounds[rounds["run_id"] == run_id].set_index("round")
        cc = clients[clients["run_id"] == run_id]
        for t in (1, 2, 5, 10, 15, 20):
            if t not in rr.index:
                continue
            g = cc[cc["round"] == t]
            tm = g["example_norm_median_true"]
            out.append(f"| {label} | {t} | {rr.loc[t, 'clip_norm']:.3g} | {g['example_norm_median'].median():.3g} | "
                       f"{tm.min():.3g} / {tm.median():.3g} / {tm.max():.3g} |")
    same = [(ids[("fedsa", s)], ids[("feddimdp 000", s)]) for s in sorted({s for _, s in ids}) if ("fedsa", s) in ids]
    for a, b in same:
        ra = rounds[rounds["run_id"] == a].sort_values("round")[["test_accuracy", "test_loss", "epsilon"]].to_numpy()
        rb = rounds[rounds["run_id"] == b].sort_values("round")[["test_accuracy", "test_loss", "epsilon"]].to_numpy()
        if len(ra) and len(rb):
            out.append(f"\nfedsa vs feddimdp 000 ({a} / {b}): rounds table bitwise equal: {bool(np.array_equal(ra, rb))}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.report_only:
        from raysim.config import run_id_for
        ids = {(label, s): run_id_for(_config(v, s)) for label, v in variants().items() for s in args.seeds}
    else:
        ids = run_all(args.results_dir, args.seeds, args.jobs)
    print(report(args.results_dir, ids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
