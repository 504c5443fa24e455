"""How long `raysim tune` takes to tune one method on the quickstart, end to end.

    python experiments/bench/tune_speed.py [--method fedsa] [--lrs 4] [--rounds 20] [--json]

Writes a tune file (the quickstart with a 200-image validation hold-out, ``--lrs`` log-spaced lrs on
[0.05, 0.8], 2 tuning seeds, 5 final seeds) to a temporary folder and runs ``raysim tune`` on it as a
user would (a subprocess with a fresh local Ray, results in a fresh folder), then reruns it. Reports
the wall time of the first call (Ray start-up, search, final stage, tables), of the rerun (which must
run nothing), the number of runs, the sum of the runs' own wall times and of their rounds, and each
run's set-up time (``startup_seconds``: σ calibration, partition, model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[2]


def stage_lines(stdout: str) -> list[str]:
    """The ``tune NAME, STAGE: N runs, D done, T to run`` lines of a ``raysim tune`` call."""
    return [line for line in stdout.splitlines() if line.startswith("tune ") and line.endswith(" to run")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="fedsa")
    parser.add_argument("--lrs", type=int, default=4, help="learning rates searched (log-spaced on [0.05, 0.8])")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tuning-seeds", type=int, default=2)
    parser.add_argument("--final-seeds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    from raysim.results import read_table
    with tempfile.TemporaryDirectory() as tmp:
        tune_file, results = Path(tmp) / "tune.yaml", Path(tmp) / "results"
        tune_file.write_text(yaml.safe_dump({
            "name": "tune-speed", "base": str(REPO / "experiments" / "quickstart.yaml"),
            "set": {"data.server_holdout": 200, "rounds": args.rounds}, "methods": [args.method],
            "space": {"lr": {"log": [0.05, 0.8], "num": args.lrs}},
            "tuning_seeds": list(range(100, 100 + args.tuning_seeds)), "final_seeds": list(range(args.final_seeds)),
        }))
        command = [sys.executable, "-m", "raysim.cli", "tune", str(tune_file), "--results-dir", str(results)]
        walls = []
        for _ in range(2):
            t0 = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
            walls.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise SystemExit(f"tune_speed: raysim tune failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        second_pass = proc.stdout
        runs, rounds = read_table(str(results), "runs"), read_table(str(results), "rounds")
    out = {
        "method": args.method, "lrs": args.lrs, "rounds": args.rounds, "tuning_seeds": args.tuning_seeds,
        "final_seeds": args.final_seeds, "runs": len(runs), "tune_wall_s": round(walls[0], 2),
        "rerun_wall_s": round(walls[1], 2),
        "rerun_ran_nothing": all(line.endswith(" 0 to run") for line in stage_lines(second_pass)),
        "sum_run_wall_s": round(float(runs["wall_seconds"].sum()), 2),
        "sum_round_s": round(float(rounds["round_seconds"].sum()), 2),
        # each run's set-up (σ calibration on a seed not calibrated before, partition, model)
        "startup_s": sorted(round(float(s), 2) for s in runs["startup_seconds"]),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"raysim tune, {args.method} on the quickstart: {args.lrs} lrs x {args.tuning_seeds} tuning seeds, then "
          f"{args.final_seeds} final seeds (tuned and fixed), {args.rounds} rounds per run")
    print(f"  runs: {out['runs']}  tune wall: {out['tune_wall_s']:.1f} s  rerun wall: {out['rerun_wall_s']:.1f} s "
          f"(ran nothing: {out['rerun_ran_nothing']})")
    print(f"  sum of the runs' wall times: {out['sum_run_wall_s']:.1f} s  sum of their rounds: {out['sum_round_s']:.1f} s")
    print(f"  the runs' set-up (s), sorted: {', '.join(f'{s:.2f}' for s in out['startup_s'])}")


if __name__ == "__main__":
    main()
