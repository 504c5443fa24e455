"""How long a user waits for the first run of `raysim run`, `raysim sweep` and `raysim tune`, from launch.

    python experiments/bench/first_run.py [--commands run,sweep,tune] [--repeats 2] [--json]

Each command is launched as a user would (a fresh process that starts its own local Ray, results in a
fresh folder), with the head start (the default, ``runtime.head_start=true``) and with
``--set runtime.head_start=false``, alternating over ``--repeats``. From the files the first run
writes it reports, counted from the launch:

* ``started_s``: the first run has started (its runs row's ``start_time``: its data is loaded and its
  row written, before its set-up: partition, σ calibration, model);
* ``setup_s``: the first run is set up (its partitions file is written: data loaded, run planned,
  round 1 about to train);
* ``round1_s``: the first round-1 record (its rounds file);
* ``exit_s``: the process has exited.

The workloads are offline (the bundled digits data): ``run`` the quickstart
(``experiments/quickstart.yaml``, fedsa, 5 rounds), ``sweep`` the smoke sweep
(``experiments/sweeps/smoke.yaml``, 4 runs), ``tune`` a search of 2 learning rates × 2 tuning seeds and 2
final seeds on the quickstart with a 200-image validation hold-out, 2 rounds per run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
SMOKE = REPO / "experiments" / "sweeps" / "smoke.yaml"
COMMANDS = ("run", "sweep", "tune")


def tune_file(folder: Path) -> Path:
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "name": "first-run", "base": str(QUICKSTART), "set": {"data.server_holdout": 200, "rounds": 2},
        "methods": ["fedsa"], "space": {"lr": {"log": [0.05, 0.4], "num": 2}},
        "tuning_seeds": [100, 101], "final_seeds": [0, 1]}))
    return path


def command_line(command: str, folder: Path) -> list[str]:
    if command == "run":
        return ["run", str(QUICKSTART), "--set", "method=fedsa", "--set", "rounds=5"]
    if command == "sweep":
        return ["sweep", str(SMOKE)]
    return ["tune", str(tune_file(folder))]


def first_mtime(pattern: str, t0: float) -> float | None:
    times = [os.path.getmtime(f) for f in glob.glob(pattern)]
    return round(min(times) - t0, 2) if times else None


def launch(command: str, head_start: bool, folder: Path) -> dict:
    """One fresh process of ``command``; times from the launch."""
    folder.mkdir(parents=True)
    results = folder / "results"
    args = [*command_line(command, folder), "--results-dir", str(results)]
    if not head_start:
        args += ["--set", "runtime.head_start=false"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, env=env,
                          cwd=folder, timeout=1800)
    exit_s = round(time.time() - t0, 2)
    if done.returncode != 0:
        raise SystemExit(f"first_run: raysim {command} failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    import pyarrow.parquet as pq
    starts = pq.read_table(str(results / "runs"), columns=["start_time"]).column("start_time").to_pylist()
    return {"command": command, "head_start": head_start,
            "started_s": round(min(t.timestamp() for t in starts) - t0, 2),
            "setup_s": first_mtime(str(results / "partitions" / "*.parquet"), t0),
            "round1_s": first_mtime(str(results / "rounds" / "*-r00001.parquet"), t0), "exit_s": exit_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated subset of run,sweep,tune")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        parser.error(f"--commands: unknown {', '.join(unknown)}; choose from {', '.join(COMMANDS)}")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for command in commands:
                # alternate which arm goes first, so that neither always runs on a warmer machine
                for head_start in ((True, False) if repeat % 2 == 0 else (False, True)):
                    name = f"{command}-{'hs' if head_start else 'wait'}-{repeat}"
                    rows.append(launch(command, head_start, Path(tmp) / name))
                    print(f"  {name}: {rows[-1]}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    print("Launch to the first run started, set up, its round 1 recorded, and to the exit (s), fresh processes:")
    print("| command | start | run started | set-up done | round 1 done | exit | median set-up |")
    print("|---|---|---|---|---|---|---|")
    for command in commands:
        for head_start in (True, False):
            mine = [r for r in rows if r["command"] == command and r["head_start"] == head_start]
            label = "head start (default)" if head_start else "`runtime.head_start=false`"
            setups = [r["setup_s"] for r in mine if r["setup_s"] is not None]
            print(f"| {command} | {label} | {', '.join(str(r['started_s']) for r in mine)} | "
                  f"{', '.join(str(r['setup_s']) for r in mine)} | "
                  f"{', '.join(str(r['round1_s']) for r in mine)} | {', '.join(str(r['exit_s']) for r in mine)} | "
                  f"{round(statistics.median(setups), 2) if setups else '—'} |")


if __name__ == "__main__":
    main()
