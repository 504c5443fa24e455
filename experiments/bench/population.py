"""Memory and round time against the population size N, at a fixed cohort (clients_per_round).

    python experiments/bench/population.py --data-root <folder with cifar10/>            # CIFAR-10
    python experiments/bench/population.py --dataset digits --sizes 100 500              # offline

Every (method, N) runs in a fresh subprocess (so peaks do not mix): a local Ray with the default
actor pool (``runtime.num_actors`` unset: one actor per CPU), a ``Simulation`` in the subprocess
itself (the process measured as "driver", where the driver actor runs on a cluster), an iid
partition (``data.min_samples_per_client`` lowered to ``--min-samples``), a fixed σ (``privacy.noise_multiplier``) and client states spilled to a temporary
state directory, ``runtime.checkpoint_every=1`` (each round pickles a checkpoint).

Memory, from ``/proc/<pid>/status``: *peak RSS* is the kernel's high-water mark (VmHWM); it includes
pages of Ray's shared-memory object store that a process touched (the train arrays, which the driver
puts there and each actor reads zero-copy), so a sum over actors counts those pages once per actor.
*Private* is the peak of RssAnon (heap, tensors), sampled every 50 ms, and *shared* the peak of
RssShmem (object-store pages mapped) over the actors, counted once. Times: *set-up* is the
``Simulation`` construction until every actor is ready; a round's wall time runs from asking for it
to having its record and checkpoint; *warm* is the mean over the rounds after the first, *driver*
the driver's own work in it (aggregation, accounting, evaluation, rows and checkpoint), not its
waiting for the clients.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

KIB = 1024


def _status(pid: int) -> dict[str, int]:
    """Memory fields of /proc/<pid>/status in bytes (empty once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * KIB
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    """Peak RssAnon / RssShmem per process, sampled until stopped."""

    def __init__(self, pids: list[int], every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pids, self.every_s = pids, every_s
        self.peak: dict[int, dict[str, int]] = {p: {"RssAnon": 0, "RssShmem": 0} for p in pids}
        self.stopped = threading.Event()

    def sample(self) -> None:
        for pid in self.pids:
            now = _status(pid)
            for key in ("RssAnon", "RssShmem"):
                self.peak[pid][key] = max(self.peak[pid][key], now.get(key, 0))

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.every_s)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.sample()


def child(args: argparse.Namespace) -> dict:
    from raysim.config import config_from_dict
    from raysim.data import load_dataset
    from raysim.runtime.driver import init_ray
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.simulation import Simulation

    cfg = config_from_dict({
        "method": args.method, "rounds": args.rounds, "seed": 0, "num_clients": args.num_clients,
        "clients_per_round": args.clients_per_round, "local_epochs": 1, "batch_size": 64, "lr": 0.01,
        "privacy": {"noise_multiplier": 1.0},
        "data": {"name": args.dataset, "root": args.data_root, "partition": "iid",
                 "min_samples_per_client": args.min_samples, "test_subsample": args.test_subsample},
        "runtime": {"executor": "ray", "checkpoint_every": 1}})
    train = load_dataset(args.dataset, "train", args.data_root)
    test = load_dataset(args.dataset, "test", args.data_root)
    init_ray()
    executor = RayExecutor()
    with tempfile.TemporaryDirectory(prefix="raysim-population-") as state_dir:
        t0 = time.perf_counter()
        sim = Simulation(cfg, train, test, executor, state_dir=state_dir)
        setup_s = time.perf_counter() - t0
        actor_pids = [p["pid"] for p in executor.placements()]
        sampler = Sampler([os.getpid(), *actor_pids])
        sampler.start()
        walls, driver_s, checkpoint_bytes, samples = [], [], [], []
        rounds = sim.run()
        while True:
            start = time.perf_counter()
            rec = next(rounds, None)
            if rec is None:
                break
            walls.append(time.perf_counter() - start)
            row = rec.round_row
            # The driver's own work: aggregation, accounting, evaluation, and what follows the round's
            # clock (rows, checkpoint). Waiting for the clients is not counted; with overlapping rounds
            # they may have trained before this round's clock started.
            driver_s.append(row["aggregation_seconds"] + row["accounting_seconds"] + row["eval_seconds"]
                            + max(0.0, walls[-1] - row["round_seconds"]))
            checkpoint_bytes.append(len(rec.checkpoint or b""))
            samples.extend(r["num_samples"] for r in rec.client_rows)
        sampler.stop()
        store = {"in_memory_bytes": sim.client_states.memory_bytes(), "spilled": sim.client_states.spilled}
        hwm = {pid: _status(pid).get("VmHWM", 0) for pid in sampler.pids}
        executor.shutdown()
    me = os.getpid()
    mib = 1.0 / (KIB * KIB)
    return {
        "method": args.method, "num_clients": args.num_clients, "clients_per_round": args.clients_per_round,
        "num_actors": len(actor_pids), "rounds": args.rounds, "mean_client_samples": sum(samples) / len(samples),
        "driver_peak_rss_mib": hwm[me] * mib, "driver_peak_private_mib": sampler.peak[me]["RssAnon"] * mib,
        "actors_peak_rss_sum_mib": sum(hwm[p] for p in actor_pids) * mib,
        "actors_peak_private_sum_mib": sum(sampler.peak[p]["RssAnon"] for p in actor_pids) * mib,
        "actors_shared_mib": max(sampler.peak[p]["RssShmem"] for p in actor_pids) * mib,
        "setup_s": setup_s, "first_round_s": walls[0],
        "warm_round_s": sum(walls[1:]) / len(walls[1:]), "warm_driver_s": sum(driver_s[1:]) / len(driver_s[1:]),
        "checkpoint_kib": checkpoint_bytes[-1] / KIB, "ledgers": len(sim.ledgers),
        "store_in_memory_bytes": store["in_memory_bytes"], "store_spilled": store["spilled"],
    }


COLUMNS = [("method", "method", "{}"), ("num_clients", "N", "{:,}"), ("mean_client_samples", "samples/client", "{:.0f}"),
           ("driver_peak_rss_mib", "driver peak RSS MiB", "{:.0f}"),
           ("driver_peak_private_mib", "driver peak private MiB", "{:.0f}"),
           ("actors_peak_rss_sum_mib", "actors Σ peak RSS MiB", "{:.0f}"),
           ("actors_peak_private_sum_mib", "actors Σ peak private MiB", "{:.0f}"),
           ("actors_shared_mib", "object store mapped MiB", "{:.0f}"),
           ("setup_s", "set-up s", "{:.1f}"), ("warm_round_s", "warm round s", "{:.2f}"),
           ("warm_driver_s", "driver s/round", "{:.3f}"), ("checkpoint_kib", "checkpoint KiB", "{:.0f}"),
           ("store_in_memory_bytes", "states in memory B", "{:,}"), ("store_spilled", "states spilled", "{:,}")]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(f.format(r[k]) for k, _, f in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=None, help="default: cifar10 with --data-root, else digits")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--methods", nargs="+", default=["fedsa", "scaffold"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[100, 1000, 10000])
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4, help="round 1 warms up; the rest are timed")
    ap.add_argument("--test-subsample", type=int, default=500)
    ap.add_argument("--min-samples", type=int, default=2, help="data.min_samples_per_client (10,000 clients of "
                    "CIFAR-10 have 5 images each)")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--num-clients", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.dataset = args.dataset or ("cifar10" if args.data_root else "digits")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first round is not timed)")
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    rows: list[dict] = []
    failed: list[str] = []
    for method in args.methods:
        for n in args.sizes:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--method", method, "--num-clients", str(n),
                   "--dataset", args.dataset, "--clients-per-round", str(args.clients_per_round),
                   "--rounds", str(args.rounds), "--test-subsample", str(args.test_subsample),
                   "--min-samples", str(args.min_samples)]
            if args.data_root:
                cmd += ["--data-root", args.data_root]
            for attempt in (1, 2):   # a busy machine can time out a local Ray's start; that is no result
                done = subprocess.run(cmd, capture_output=True, text=True)
                result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode == 0 and result:
                    rows.append(json.loads(result[-1][len("RESULT "):]))
                    print(f"done: {method} N={n}: {result[-1]}", file=sys.stderr, flush=True)
                    break
                print(f"{method} N={n} failed (exit {done.returncode}, attempt {attempt}):\n{done.stderr[-3000:]}",
                      file=sys.stderr, flush=True)
            else:
                failed.append(f"{method} N={n}")
    print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=1))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
