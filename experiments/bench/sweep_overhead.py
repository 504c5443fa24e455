"""What a sweep pays besides training: the smoke sweep with the warm-actor pool on and off, in one run.

    python experiments/bench/sweep_overhead.py [--sweep experiments/sweeps/smoke.yaml] [--max-concurrent N] [--per-run] [--json]

Both arms run the same sweep on one local Ray (started once, before either arm), each into a
fresh results folder, in alternating order over ``--repeats`` (pool off first, then on, then
off, ...). For each arm the script reads the tables the sweep wrote and reports:

* ``round_s``: the sum over runs of their rounds' ``round_seconds`` (the work);
* ``wall_s``: the sweep's wall time (``run_sweep`` call to return);
* ``ratio``: wall / round time (1 would be a sweep with no overhead at all);
* overhead of a run: its ``wall_seconds`` (runs table: its start to its completion) minus its
  rounds' time: what a sweep pays for every run (process start, imports, data, set-up, writes).
  ``overhead_cold_s`` averages the runs that started their own actors (with the pool: the first
  run of each concurrent slot), ``overhead_warm_s`` the runs that borrowed warm actors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raysim.results import read_table  # noqa: E402
from raysim.runtime import execute_row  # noqa: E402
from raysim.runtime.driver import init_ray  # noqa: E402
from raysim.runtime.sweep_runner import run_sweep  # noqa: E402
from raysim.sweep import check_sweep, load_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def one_sweep(sweep, reuse: bool, folder: str, max_concurrent: int | None) -> dict:
    t0 = time.perf_counter()
    outcomes = run_sweep(check_sweep(sweep), folder, sweep.sweep_id, run_one=execute_row, reuse_actors=reuse,
                         max_concurrent=max_concurrent)
    wall = time.perf_counter() - t0
    failed = [o for o in outcomes if o.status != "completed"]
    if failed:
        raise SystemExit(f"sweep_overhead: {len(failed)} run(s) failed: {failed[0].error}")
    runs = read_table(folder, "runs").sort_values("start_time")
    rounds = read_table(folder, "rounds")
    per_run = rounds.groupby("run_id")["round_seconds"].sum()
    warm = [bool(w) for w in runs["warm_actors"]]
    overhead = [float(r.wall_seconds - per_run[r.run_id]) for r in runs.itertuples()]
    cold_o = [o for o, w in zip(overhead, warm) if not w]
    warm_o = [o for o, w in zip(overhead, warm) if w]
    return {"runs": len(runs), "round_s": float(per_run.sum()), "wall_s": wall, "ratio": wall / float(per_run.sum()),
            "overhead_cold_s": statistics.mean(cold_o) if cold_o else None,
            "overhead_warm_s": statistics.mean(warm_o) if warm_o else None, "cold_runs": len(cold_o),
            "warm_runs": len(warm_o), "startup_s": [float(s) for s in runs["startup_seconds"]], "warm_actors": warm,
            "per_run": [{"run_id": r.run_id, "warm": w, "wall_s": float(r.wall_seconds), "round_s": float(per_run[r.run_id]),
                         "overhead_s": o} for r, w, o in zip(runs.itertuples(), warm, overhead)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default=str(REPO / "experiments" / "sweeps" / "smoke.yaml"))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="runs at once (default: as many as fit the cluster, as raysim sweep does)")
    ap.add_argument("--per-run", action="store_true", help="also list each run of the last repeat")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sweep = load_sweep(args.sweep, overrides=["runtime.executor=ray"])
    init_ray()
    arms: dict[str, list[dict]] = {"pool off": [], "pool on": []}
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        for rep in range(args.repeats):
            for name, reuse in (("pool off", False), ("pool on", True)):
                arms[name].append(one_sweep(sweep, reuse, os.path.join(tmp, f"{name.replace(' ', '-')}-{rep}"),
                                             args.max_concurrent))
    keys = ("round_s", "wall_s", "ratio", "overhead_cold_s", "overhead_warm_s", "cold_runs", "warm_runs")
    summary = {name: {k: (statistics.mean(r[k] for r in results) if all(r[k] is not None for r in results) else None)
                      for k in keys}
               | {"runs": results[0]["runs"], "warm_actors": results[-1]["warm_actors"], "per_run": results[-1]["per_run"]}
               for name, results in arms.items()}
    result = {"sweep": args.sweep, "cpus": os.cpu_count(), "repeats": args.repeats,
              "max_concurrent": args.max_concurrent, "arms": summary}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"sweep={Path(args.sweep).name} runs={summary['pool on']['runs']} cpus={os.cpu_count()} repeats={args.repeats} "
          f"max_concurrent={args.max_concurrent or 'default'}")
    print("| actors | sum of round time (s) | sweep wall (s) | wall / rounds | overhead per run, fresh actors (s) | "
          "overhead per run, warm actors (s) |")
    print("|---|---|---|---|---|---|")
    for name, r in summary.items():
        warm = f"{r['overhead_warm_s']:.2f} ({r['warm_runs']:.0f} runs)" if r["warm_runs"] else "—"
        cold = f"{r['overhead_cold_s']:.2f} ({r['cold_runs']:.0f} runs)" if r["cold_runs"] else "—"
        print(f"| {name} | {r['round_s']:.2f} | {r['wall_s']:.2f} | {r['ratio']:.2f} | {cold} | {warm} |")
    if args.per_run:
        print("\n| arm | run | actors | wall (s) | rounds (s) | overhead (s) |\n|---|---|---|---|---|---|")
        for name, r in summary.items():
            for run in r["per_run"]:
                print(f"| {name} | {run['run_id']} | {'warm' if run['warm'] else 'fresh'} | {run['wall_s']:.3f} | "
                      f"{run['round_s']:.3f} | {run['overhead_s']:.3f} |")


if __name__ == "__main__":
    main()
