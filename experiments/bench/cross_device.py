"""The cross-device CIFAR-10 workload against its compute floor: Ray and serial rounds, time to the first round.

    python experiments/bench/cross_device.py --data-root DATA_ROOT [--timed-rounds 5] [--variants nodp,record,client]
    python experiments/bench/cross_device.py --dataset digits          # offline (a smaller federation)
    python experiments/bench/cross_device.py --config experiments/paper/shakespeare.yaml --dataset shakespeare \
        --set data.max_samples_per_user=200 --variants nodp,record      # the natural Shakespeare federation

The workload is ``experiments/paper/cross_device_cifar10.yaml`` with ``participation=uniform``, so
exactly ``clients_per_round`` (50) clients train per round: 1,000 IID clients of 50 images (45 train,
5 local validation), batch 10, one local epoch, lr 0.1, FedAvg. Variants: ``nodp``
(``privacy.epsilon=null``), ``record`` (the yaml as is: record-level DP-SGD, ε = 8) and ``client``
(``privacy.unit=client``: DP-FedAvg, local SGD without DP, each update clipped, the server's noise
once on the cohort sum, sized for a deployment of 1,000 clients a round out of 10⁶ as pfl-research's
benchmark does; the fixed-size cohorts are accounted with RDP). ``--dataset digits`` runs the same shape on the bundled digits data, with 25
clients and 10 a round unless ``--set`` says otherwise.

Measured in one run, in this order:

* ``floor``: the compute floor, plain SGD in this process with 2 torch threads on pre-built float
  tensors, over the same clients (round 1's cohort of the run, its train shards) at the same batch
  size, one local epoch each, every client starting from the same weights: the work of one round
  with nothing else. Timed ``--timed-rounds`` times after one warm-up pass, in NCHW and in
  channels-last; the floor is the faster layout's median.
* per variant, ``serial`` and ``ray``: the run as ``raysim run`` executes it (``execute`` into a
  fresh results folder, rows, checkpoints and all), ``1 + --timed-rounds`` rounds, the serial
  executor in this process at ``--serial-threads`` torch threads, then Ray (one local Ray for the
  whole benchmark, the run's default actors), then Ray with ``runtime.sum_on_actors=true`` (each actor
  returns its clients' summed update, ``ray_summed``). A round's time is the wall time between two
  consecutive round records; round 1 is left out and the median of the rest is reported.
* per variant, ``fresh`` and ``fresh_waiting``: a fresh ``raysim run`` process with ``1 + --timed-rounds``
  rounds that starts its own local Ray, with its default head start (the first clients train in that
  process while Ray and the actors start, then the actors take over) and with
  ``runtime.head_start=false`` (a driver actor, once Ray and the actors are up), one after the other,
  after the benchmark's own Ray is shut down:
  ``start_s``, from launching the process until the run's set-up is done (imports, data, the plan;
  without the head start also Ray and the actors); ``first_round_s``, until round 1's record;
  ``rounds_s``, the wall time between consecutive round records after it (``round_s``, their median;
  with the head start, the first of them may still train in that process); ``process_wall_s``, until
  the process exits.

The ``ray`` run is what a sweep's run or a run joining a cluster does (a driver actor); the ``fresh``
run is what ``raysim run`` does on a machine without a running Ray.

Every time is printed with its ratio to the floor.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raysim.allocator import spin_less  # noqa: E402

spin_less()        # as the raysim command does, before torch loads (and the local Ray this starts inherits it)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from raysim.config import apply_overrides, cli_overrides, config_from_dict, read_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "paper" / "cross_device_cifar10.yaml"

#: (key, row name, overrides)
VARIANTS = [("nodp", "no DP", ["privacy.epsilon=null", "privacy.unit=example"]),
            ("record", "record-level DP (ε = 8)", ["privacy.unit=example"]),
            ("client", "client-level DP (ε = 8, noise of 1,000 out of 10⁶)",
             ["privacy.unit=client", "privacy.accountant=rdp", "privacy.noise_cohort_size=1000",
              "privacy.population_size=1000000"])]

DIGITS = ["num_clients=25", "clients_per_round=10", "data.min_samples_per_client=10"]

# ``--trace-startup``: the steps of a driver-actor run's start-up (``raysim run`` with
# ``runtime.head_start=false``) one by one in a fresh process, each stamped with the wall clock from the
# launch (argv[1]); argv[2:] are --set overrides, then the data root last.
_TRACE = """
import json, sys, time
t0, stamps = float(sys.argv[1]), []
def stamp(step): stamps.append((step, time.time() - t0))
stamp("interpreter up")
import raysim.cli, raysim.experiment, raysim.runtime.driver, ray
stamp("imports (raysim.cli, raysim.experiment, raysim.runtime.driver)")
from raysim.config import apply_overrides, cli_overrides, config_from_dict, read_yaml
from raysim.experiment import prepare
from raysim.run_plan import plan_run
plan = plan_run(config_from_dict(apply_overrides(read_yaml(sys.argv[2]), cli_overrides(sys.argv[3:-1], sys.argv[-1]))))
data = prepare(plan)
stamp("config, data loaded from the cache, preflight partition")
raysim.runtime.driver.init_ray()
stamp("ray.init (a fresh local Ray)")
setup, records, driver, warm = raysim.runtime.driver.ray_rounds(plan, *data)
stamp("actors and driver actor started, run planned (set-up done)")
it = iter(records)
next(it)
stamp("round 1 recorded")
next(it)
stamp("round 2 recorded")
# Ray's task timeline of the run: each actor call and its phases, from the launch (``ray.timeline``),
# read before the run ends (ending it kills its actors, and a killed worker's unsent events are lost)
# and once it stops growing (workers send their events about once a second; at most 20 s).
events, deadline = [], time.time() + 20
while time.time() < deadline:
    time.sleep(2)
    latest = [e for e in ray.timeline() if e.get("ph") == "X"]
    if events and len(latest) == len(events):
        break
    events = latest
tasks = sorted((e["ts"] / 1e6 - t0, e["dur"] / 1e6, str(e.get("tid")), e["name"]) for e in events
               if e.get("dur", 0) >= 50_000)
for _ in it:
    pass
print(json.dumps({"stamps": stamps, "tasks": tasks}))
"""

# Run inside the child process of the fresh-run measurement: the CLI itself, with the progress
# display's two callbacks stamped with the wall clock (setup done, each round recorded).
_CHILD = """
import json, sys, time
stamps = {"rounds": []}
import raysim.progress as progress
setup, round_ = progress.RunProgress.setup, progress.RunProgress.round
def on_setup(self, s):
    stamps.setdefault("setup", time.time()); return setup(self, s)
def on_round(self, r):
    stamps["rounds"].append(time.time()); return round_(self, r)
progress.RunProgress.setup, progress.RunProgress.round = on_setup, on_round
from raysim.cli import main
code = main(sys.argv[2:])
open(sys.argv[1], "w").write(json.dumps(stamps))
sys.exit(code)
"""


def variant_overrides(args: argparse.Namespace, extra: list[str]) -> list[str]:
    base = ["participation=uniform", f"data.name={args.dataset}"]
    if args.dataset == "digits":
        base += DIGITS
    return base + extra + list(args.set)


def make_config(args: argparse.Namespace, overrides: list[str], rounds: int, **runtime):
    values = apply_overrides(read_yaml(str(args.config)), cli_overrides(overrides, args.data_root, None))
    values["rounds"] = rounds
    values["runtime"] = {**values.get("runtime", {}), **runtime}
    return config_from_dict(values)


# ----------------------------------------------------------------------------------------------- the floor

def floor(cfg, train, timed: int, threads: int) -> dict:
    """Plain SGD over round 1's cohort, pre-built tensors, one process at ``threads`` threads."""
    from raysim.algorithms.registry import get_method
    from raysim.data import to_float_tensor
    from raysim.models import init_parameters, model_for
    from raysim.participation import participation_schedule
    from raysim.rng import np_generator, torch_generator
    from raysim.run_data import make_partition

    torch.set_num_threads(threads)
    clients = make_partition(cfg, train)
    cohort = participation_schedule(cfg)[0]
    shards = [(to_float_tensor(train.x[clients[c].train_indices], train.info),
               torch.from_numpy(train.y[clients[c].train_indices].astype(np.int64))) for c in cohort]
    model = model_for(cfg, train.info, get_method(cfg.method).model_options(cfg))
    init_parameters(model, torch_generator(cfg.train_seed, "model-init"))
    start = copy.deepcopy(model.state_dict())
    samples = sum(len(y) for _, y in shards)
    out = {"clients": len(shards), "samples": samples, "threads": threads}
    images = shards[0][0].dim() == 4
    for layout in ("nchw", "channels_last") if images else ("nchw",):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        m = copy.deepcopy(model).to(memory_format=fmt)
        data = [(x.contiguous(memory_format=fmt), y) for x, y in shards]
        walls = []
        for rep in range(1 + timed):
            t0 = time.perf_counter()
            for k, (x, y) in enumerate(data):
                m.load_state_dict(start)
                opt = torch.optim.SGD(m.parameters(), lr=cfg.lr)
                order = np_generator(0, "floor", rep, k).permutation(len(y))
                for i in range(0, len(y), cfg.batch_size):
                    idx = torch.from_numpy(np.sort(order[i:i + cfg.batch_size]))
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(m(x[idx]), y[idx]).backward()
                    opt.step()
            if rep:
                walls.append(time.perf_counter() - t0)
        out[layout] = statistics.median(walls)
    out["floor_s"] = min(out["nchw"], out.get("channels_last", out["nchw"]))
    return out


# ----------------------------------------------------------------------------------------------- runs

def timed_run(cfg, data, folder: str) -> dict:
    """``execute`` as ``raysim run`` does; round times from the wall clock between round records."""
    from raysim.runtime import execute
    stamps: list[float] = []
    t0 = time.perf_counter()
    summary = execute(cfg, folder, data=data, on_round=lambda rec: stamps.append(time.perf_counter()))
    walls = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"round_s": statistics.median(walls), "rounds_s": walls, "first_round_s": stamps[0] - t0,
            "startup_s": float(summary.row.get("startup_seconds") or 0.0), "accuracy": summary.row["final_test_accuracy"]}


def fresh_run(args: argparse.Namespace, overrides: list[str], folder: str, rounds: int) -> dict:
    """A fresh ``raysim run`` process that starts its own local Ray: launch to set-up done, to round 1's
    record, and the median time between later round records."""
    os.makedirs(folder)
    stamp_file = os.path.join(folder, "stamps.json")
    cmd = [sys.executable, "-c", _CHILD, stamp_file, "run", str(args.config), "--results-dir",
           os.path.join(folder, "results"), *(["--data-root", args.data_root] if args.data_root else []),
           *[a for o in overrides + [f"rounds={rounds}"] for a in ("--set", o)]]
    import raysim
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(Path(raysim.__file__).resolve().parents[1])}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder, timeout=900)
    wall = time.time() - t0
    if done.returncode != 0:
        raise SystemExit(f"cross_device: raysim run failed:\n{done.stderr[-3000:]}")
    stamps = json.loads(Path(stamp_file).read_text())
    ends = stamps["rounds"]
    walls = [b - a for a, b in zip(ends, ends[1:])]
    return {"start_s": stamps["setup"] - t0, "first_round_s": ends[0] - t0,
            "round_s": statistics.median(walls) if walls else None, "rounds_s": walls, "process_wall_s": wall}


def trace_startup(args: argparse.Namespace, overrides: list[str]) -> dict:
    """``_TRACE`` in a fresh process on a fresh local Ray: when each step of a run ends, from the launch
    (``stamps``), and Ray's task timeline of the run (``tasks``: start, duration, worker, name)."""
    import raysim
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(Path(raysim.__file__).resolve().parents[1])}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", _TRACE, repr(t0), str(args.config), *overrides, "rounds=2",
                           args.data_root or ""], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"cross_device: the start-up trace failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--dataset", default=None, help="cifar10 (needs --data-root) or digits; default: cifar10 with "
                                                    "--data-root, else digits")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--timed-rounds", type=int, default=5, help="rounds timed after the first (default 5)")
    ap.add_argument("--variants", default="nodp,record,client")
    ap.add_argument("--serial-threads", type=int, default=2)
    ap.add_argument("--floor-threads", type=int, default=2)
    ap.add_argument("--no-first-round", action="store_true", help="skip the fresh `raysim run` processes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--trace-startup", action="store_true",
                    help="only time the steps of a fresh driver-actor run's start-up (first variant of --variants), "
                         "one by one, and print Ray's task timeline of that run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.dataset = args.dataset or ("cifar10" if args.data_root else "digits")
    if args.data_root:   # the fresh processes run in a temporary folder
        args.data_root = os.path.abspath(args.data_root)
    keys = args.variants.split(",")
    unknown = set(keys) - {k for k, _, _ in VARIANTS}
    if unknown:
        ap.error(f"--variants: unknown {', '.join(sorted(unknown))}")

    if args.trace_startup:
        extra = next(e for k, _, e in VARIANTS if k == keys[0])
        stamps = trace_startup(args, variant_overrides(args, extra))
        if args.json:
            print(json.dumps(stamps, indent=2))
            return
        print(f"{args.dataset}, variant {keys[0]}: a fresh process on a fresh local Ray, {os.cpu_count()} CPUs\n")
        print("| step | ends at (s) | takes (s) |\n|---|---|---|")
        previous = 0.0
        for step, at in stamps["stamps"]:
            print(f"| {step} | {at:.2f} | {at - previous:.2f} |")
            previous = at
        workers = {w: f"worker {k}" for k, w in enumerate(dict.fromkeys(w for _, _, w, _ in stamps["tasks"]))}
        print("\nRay's task timeline of the run (calls and phases of at least 50 ms; `ray.timeline`):\n")
        print("| starts at (s) | takes (s) | process | call or phase |\n|---|---|---|---|")
        for at, took, w, name in stamps["tasks"]:
            print(f"| {at:.2f} | {took:.2f} | {workers[w]} | {name} |")
        return

    import ray

    from raysim.experiment import prepare
    from raysim.runtime.driver import init_ray

    rounds = 1 + args.timed_rounds
    # the floor and the data need no privacy settings: the no-DP variant's config plans them
    base = make_config(args, variant_overrides(args, VARIANTS[0][2]), rounds)
    data = prepare(base)
    result: dict = {"dataset": args.dataset, "cpus": os.cpu_count(), "num_clients": base.num_clients,
                    "clients_per_round": base.clients_per_round, "batch_size": base.batch_size,
                    "timed_rounds": args.timed_rounds, "variants": {}}
    result["floor"] = floor(base, data[0], args.timed_rounds, args.floor_threads)
    fl = result["floor"]["floor_s"]
    init_ray()
    with tempfile.TemporaryDirectory(prefix="cross-device-") as tmp:
        for key, name, extra in VARIANTS:
            if key not in keys:
                continue
            overrides = variant_overrides(args, extra)
            row: dict = {"name": name, "overrides": overrides}
            serial_cfg = make_config(args, overrides, rounds, executor="serial", torch_threads=args.serial_threads)
            row["serial"] = timed_run(serial_cfg, data, os.path.join(tmp, f"{key}-serial"))
            ray_cfg = make_config(args, overrides, rounds, executor="ray")
            row["ray"] = timed_run(ray_cfg, data, os.path.join(tmp, f"{key}-ray"))
            row["ray_over_floor"] = row["ray"]["round_s"] / fl
            summed_cfg = make_config(args, overrides, rounds, executor="ray", sum_on_actors=True)
            row["ray_summed"] = timed_run(summed_cfg, data, os.path.join(tmp, f"{key}-ray-summed"))
            row["ray_summed_over_floor"] = row["ray_summed"]["round_s"] / fl
            row["serial_over_floor"] = row["serial"]["round_s"] / fl
            result["variants"][key] = row
        ray.shutdown()   # the fresh runs start their own Ray, on a machine without another one
        for key, row in ([] if args.no_first_round else result["variants"].items()):
            row["fresh"] = fresh_run(args, row["overrides"], os.path.join(tmp, f"{key}-fresh"), rounds)
            row["fresh_waiting"] = fresh_run(args, row["overrides"] + ["runtime.head_start=false"],
                                             os.path.join(tmp, f"{key}-fresh-waiting"), rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    f = result["floor"]
    print(f"{args.dataset}: {base.num_clients} clients, {base.clients_per_round} a round ({f['samples']} samples), "
          f"batch {base.batch_size}, {args.timed_rounds} timed rounds after the first, {os.cpu_count()} CPUs")
    layouts = f"NCHW {f['nchw']:.3f} s, channels-last {f['channels_last']:.3f} s" if "channels_last" in f else \
        f"{f['nchw']:.3f} s"
    print(f"compute floor: plain SGD, {f['threads']} threads, pre-built tensors: {layouts} per round; "
          f"floor = {fl:.3f} s\n")
    print("| variant | Ray round, driver actor (s) | ×floor | the same, `runtime.sum_on_actors` (s) | ×floor | "
          "serial round (s) | ×floor | test accuracy: Ray, summed, serial |")
    print("|---|---|---|---|---|---|---|---|")
    for row in result["variants"].values():
        print(f"| {row['name']} | {row['ray']['round_s']:.3f} | {row['ray_over_floor']:.2f} | "
              f"{row['ray_summed']['round_s']:.3f} | {row['ray_summed_over_floor']:.2f} | "
              f"{row['serial']['round_s']:.3f} | {row['serial_over_floor']:.2f} | "
              f"{row['ray']['accuracy']:.4f}, {row['ray_summed']['accuracy']:.4f}, {row['serial']['accuracy']:.4f} |")
    if args.no_first_round:
        return
    print("\nA fresh `raysim run` (its own local Ray): launch to set-up done, to round 1's record and to the "
          "process's exit; the wall time between later round records:\n")
    print("| variant | start | set-up done (s) | ×floor | round 1 done (s) | rounds 2.. (s) | exit (s) |")
    print("|---|---|---|---|---|---|---|")
    for row in result["variants"].values():
        for label, key in (("head start (default)", "fresh"), ("`runtime.head_start=false`", "fresh_waiting")):
            f = row[key]
            later = ", ".join(f"{w:.2f}" for w in f["rounds_s"])
            print(f"| {row['name']} | {label} | {f['start_s']:.2f} | {f['start_s'] / fl:.2f} | "
                  f"{f['first_round_s']:.2f} | {later} | {f['process_wall_s']:.1f} |")

if __name__ == "__main__":
    main()
