"""What a client-level noise mechanism costs a cross-device round, accounting included, and its state's memory.

    python experiments/bench/mechanism_cost.py --data-root DATA_ROOT [--rounds 6] [--json]
    python experiments/bench/mechanism_cost.py --dataset digits          # offline, a smaller federation

The workload is ``experiments/paper/cross_device_cifar10.yaml`` under ``privacy.unit=client``: DP-FedAvg
over N = 1,000 clients, k = 50 expected a round, T = 200 rounds planned, ε = 8 at δ = 1e-6, the paper CNN.
Each mechanism runs in turn, in this process, with the serial executor at ``--threads`` torch threads:

- ``gaussian``: independent noise, Poisson cohorts, PLD accounting;
- ``gaussian-fixed``: the same on fixed-size cohorts of exactly k (replace-one adjacency), RDP accounting;
- ``tree``: DP-FTRL's tree over shuffled passes, RDP accounting;
- ``blt`` and ``bandmf``: correlated noise over cyclic Poisson groups (G = min(N / k, T) = 20).

The clip norm is 1e-4, so that the population's noise (σ·C/k on every coordinate) cannot make the
model diverge in a few rounds; what a round costs does not depend on it. A run is built as ``raysim run``
builds it (:func:`raysim.run_plan.plan_run`, ``Simulation``) and its
first ``--rounds`` rounds of the 200 planned run (no evaluation before the last). Per round:

- ``round_s``: the round's wall time (the rounds table's ``round_seconds``);
- ``release_s``: the server's release, timed around ``Server.private_mean`` (or ``tree_release``): the
  noise draw, the correlated stream's step, and the noised mean;
- ``accounting_s``: the rounds table's ``accounting_seconds`` (the privacy book's record and ε).

Reported: the medians over rounds 2.. (round 1 warms caches), ``share`` = (release + accounting) / round,
the privacy plan's time (calibration and strategy optimisation, once per run, before round 1) and the
server's noise state in bytes (the BLT buffers, BandMF's ring of past noise, the tree's pass anchor and
running sum). The release of ``gaussian`` is the cost every mechanism pays (one model-sized normal draw);
the difference to it is what correlation adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raysim import simulation as simulation_module  # noqa: E402
from raysim.algorithms.base import Server  # noqa: E402
from raysim.config import apply_overrides, cli_overrides, config_from_dict, read_yaml  # noqa: E402
from raysim.experiment import prepare  # noqa: E402
from raysim.run_plan import plan_run  # noqa: E402
from raysim.runtime.serial import SerialExecutor  # noqa: E402

ARMS = {
    "gaussian": [("privacy.mechanism", "gaussian"), ("participation", "poisson")],
    "gaussian-fixed": [("privacy.mechanism", "gaussian"), ("participation", "uniform"), ("privacy.accountant", "rdp")],
    "tree": [("privacy.mechanism", "tree"), ("participation", "shuffle"), ("privacy.accountant", "rdp")],
    "blt": [("privacy.mechanism", "blt"), ("participation", "poisson")],
    "bandmf": [("privacy.mechanism", "bandmf"), ("participation", "poisson")],
}


def _state_bytes(server: Server) -> int:
    """The server's noise state: the correlated stream's tensors, or the tree's anchor and pass sum."""
    tensors = []
    stream = getattr(server, "noise_stream", None)
    if stream is not None:
        tensors += [v for v in stream.state_dict().values() if isinstance(v, torch.Tensor)]
    tensors += [t for t in (getattr(server, "tree_anchor", None), getattr(server, "tree_sum", None))
                if isinstance(t, torch.Tensor)]
    return int(sum(t.numel() * t.element_size() for t in tensors))


def measure(values: dict, mechanism: str, rounds: int) -> dict:
    cfg = config_from_dict(apply_overrides(values, ARMS[mechanism]))
    plan = plan_run(cfg)
    train, test = prepare(plan)
    releases: list[float] = []
    plans: list[float] = []

    def timed(fn, into: list[float]):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - start)
        return wrapper

    original_plan = simulation_module.client_level_plan
    saved = Server.private_mean, Server.tree_release
    Server.private_mean = timed(Server.private_mean, releases)
    Server.tree_release = timed(Server.tree_release, releases)
    simulation_module.client_level_plan = timed(original_plan, plans)
    try:
        sim = simulation_module.Simulation(plan, train, test, SerialExecutor())
        round_s, accounting_s = [], []
        for record in sim.run():
            round_s.append(record.round_row["round_seconds"])
            accounting_s.append(record.round_row["accounting_seconds"])
            if record.server_round == rounds:
                break
        state = _state_bytes(sim.server)
        sim.executor.shutdown()
    finally:
        Server.private_mean, Server.tree_release = saved
        simulation_module.client_level_plan = original_plan
    later = slice(1, None) if rounds > 1 else slice(None)
    row = {"mechanism": mechanism, "round_s": statistics.median(round_s[later]),
           "release_s": statistics.median(releases[later]), "accounting_s": statistics.median(accounting_s[later]),
           "plan_s": sum(plans), "state_bytes": state, "num_params": int(sim.weights.numel()),
           "sigma": float(sim.server.ctx.client_level.sigma)}
    row["share"] = (row["release_s"] + row["accounting_s"]) / row["round_s"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", default=None)
    p.add_argument("--dataset", default="cifar10", choices=["cifar10", "digits"])
    p.add_argument("--rounds", type=int, default=6, help="rounds run of each mechanism (the medians skip round 1)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the serial executor")
    p.add_argument("--mechanisms", default=",".join(ARMS), help=f"a subset of {','.join(ARMS)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    values = read_yaml(REPO / "experiments" / "paper" / "cross_device_cifar10.yaml")
    sets = [("privacy.unit", "client"), ("privacy.clip_norm", 1e-4), ("runtime.executor", "serial"), ("runtime.torch_threads", args.threads),
            ("runtime.checkpoint_every", 0), ("eval_every", args.rounds)]
    if args.dataset == "digits":
        sets += [("data.name", "digits"), ("num_clients", 100), ("clients_per_round", 10), ("privacy.delta", 1e-5)]
    values = apply_overrides(values, [*cli_overrides((), args.data_root, None), *sets])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    rows = []
    for mechanism in args.mechanisms.split(","):
        rows.append(measure(values, mechanism, args.rounds))
        print(f"{mechanism}: done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"cpu": cpu, "dataset": args.dataset, "threads": args.threads, "rows": rows}))
        return
    print(f"{args.dataset}, {rows[0]['num_params']:,} parameters, {args.threads} torch threads, {cpu}")
    print("| mechanism | σ | round | release | accounting | share | plan (once) | noise state |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['sigma']:.3f} | {r['round_s']:.3f} s | {r['release_s'] * 1e3:.0f} ms | "
              f"{r['accounting_s'] * 1e3:.0f} ms | {r['share']:.1%} | {r['plan_s']:.2f} s | "
              f"{r['state_bytes'] / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
