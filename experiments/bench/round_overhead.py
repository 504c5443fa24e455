"""One warm round on Ray (10 client actors) vs the serial executor, same work, one process.

    python experiments/bench/round_overhead.py --data-root ../shared/data            # CIFAR-10
    python experiments/bench/round_overhead.py --dataset digits --local-epochs 20   # offline

Start-up (``startup_s``) is the time from ``Simulation`` construction until every worker is
ready (actors started, torch imported, model built): the server partitions and plans while the
actors start. Each executor runs the run the way every run goes, through ``Simulation.run``
(on Ray, round t+1 trains while round t is evaluated), serial first, then Ray. A round's time is
the wall time between two consecutive records; round 1 warms up (first-touch allocation) and is
left out, and the timed value is the median of the following ``--timed-rounds`` rounds (the JSON
also has the mean and every round). Both executors run single-threaded torch per client
(``runtime.torch_threads``); Ray runs up to one actor per core at a time. Prints a table and the
ratio ray/serial (< 1: Ray is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raysim.config import config_from_dict  # noqa: E402
from raysim.data import load_dataset  # noqa: E402
from raysim.simulation import Simulation  # noqa: E402


def measure(cfg, train, test, executor, overlap: bool = True) -> dict:
    t0 = time.perf_counter()
    sim = Simulation(cfg, train, test, executor)
    startup = sim.setup.startup_seconds
    # Without overlap: one round after the other, as Simulation.round runs them (round t+1 is
    # submitted only after round t is evaluated).
    records = sim.run() if overlap else (sim.round(t) for t in range(1, cfg.rounds + 1))
    first = next(records)
    previous = time.perf_counter()
    first_incl_setup = previous - t0
    walls = []
    for _ in records:
        now = time.perf_counter()
        walls.append(now - previous)
        previous = now
    executor.shutdown()
    return {"startup_s": startup, "first_round_incl_setup_s": first_incl_setup,
            "first_round_accuracy": first.round_row["test_accuracy"], "warm_round_s": statistics.median(walls),
            "warm_round_mean_s": statistics.fmean(walls), "warm_rounds_s": walls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=None, help="default: cifar10 with --data-root, else digits")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--num-clients", type=int, default=10)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--timed-rounds", type=int, default=30)
    ap.add_argument("--num-actors", type=int, default=None, help="Ray client actors (default: --num-clients)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="Ray: do not submit round t+1 while round t is evaluated (to measure what the overlap saves)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    dataset = args.dataset or ("cifar10" if args.data_root else "digits")
    base = {"method": args.method, "rounds": 1 + args.timed_rounds, "num_clients": args.num_clients,
            "local_epochs": args.local_epochs, "batch_size": 64, "lr": 0.01,
            "data": {"name": dataset, "root": args.data_root, "partition": "dirichlet", "alpha": 0.3,
                     "test_subsample": 2000}}
    train = load_dataset(dataset, "train", args.data_root)
    test = load_dataset(dataset, "test", args.data_root)

    from raysim.runtime.driver import init_ray
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.runtime.serial import SerialExecutor
    init_ray()
    serial_cfg = config_from_dict({**base, "runtime": {"executor": "serial"}})
    ray_cfg = config_from_dict({**base, "runtime": {"executor": "ray", "num_actors": args.num_actors or args.num_clients}})
    serial = measure(serial_cfg, train, test, SerialExecutor())
    on_ray = measure(ray_cfg, train, test, RayExecutor(), overlap=not args.no_overlap)
    ratio = on_ray["warm_round_s"] / serial["warm_round_s"]
    actors = ray_cfg.runtime.num_actors
    result = {"dataset": dataset, "method": args.method, "num_clients": args.num_clients, "num_actors": actors,
              "overlap": not args.no_overlap, "cpus": os.cpu_count(), "serial": serial, "ray": on_ray, "ratio_ray_over_serial": ratio}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"dataset={dataset} method={args.method} clients={args.num_clients} local_epochs={args.local_epochs} cpus={os.cpu_count()}")
    print(f"| executor | start-up (s) | first round incl. start-up (s) | warm round, median of {args.timed_rounds} (s) |")
    print("|---|---|---|---|")
    ray_name = f"ray, {actors} actors" + (", no overlap" if args.no_overlap else "")
    for name, r in (("serial", serial), (ray_name, on_ray)):
        print(f"| {name} | {r['startup_s']:.2f} | {r['first_round_incl_setup_s']:.2f} | {r['warm_round_s']:.3f} |")
    print(f"ratio ray/serial (median warm round) = {ratio:.3f}")
    print(f"start-up of {actors} actors = {on_ray['startup_s']:.2f} s (Simulation construction to every actor ready)")


if __name__ == "__main__":
    main()
