"""Client-level noise mechanisms at the same ε: σ, the noise left on the model, plan time, stream cost.

    python experiments/bench/correlated_noise.py                     # N = 1,000, k = 50, T = 200, ε = 8
    python experiments/bench/correlated_noise.py --rounds 100 --epsilon 2 --json

For each mechanism (gaussian with Poisson cohorts, tree with shuffled passes, blt and bandmf with cyclic
Poisson groups, at the default G = min(N // k, T) and at G = 5) the privacy plan is built as a run builds
it (``client_level_plan``: σ calibrated to ε, the strategy optimised), timed, and the std of the noise on
the released prefix sums of the updates (the model's noise) is computed from the strategy, in units of
C/k: its maximum and mean over the T prefixes, and ``round_noise``, the largest std of one round's release
(σ·sens times the largest row norm of C⁻¹; σ for independent noise). ``--workload-decays`` adds a bandmf row
for each ``privacy.workload_decay``. ``damped_noise_<η>`` is the noise left on the model after
round T when training pulls the model back by a fraction η of its displacement each round
(w_t = (1 − η) w_{t−1} + release_t: a quadratic loss's restoring force, which the prefix-sum workload,
η = 0, leaves out), for each η of ``--decays``. Then one noise-stream step (``--params`` coordinates,
default the paper CNN's 2,156,490, one torch thread) is timed per mechanism, beside the i.i.d. draw.
numpy, scipy and torch only; no data, no Ray.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from scipy.signal import lfilter

from raysim.config import config_from_dict
from raysim.noise import GaussianNoise
from raysim.privacy.mechanisms.toeplitz import inverse_coefs, per_query_error
from raysim.privacy.population import client_level_plan


def _plan_rows(args: argparse.Namespace) -> list[dict]:
    base = {"method": "fedavg", "num_clients": args.clients, "clients_per_round": args.cohort,
            "participation": "poisson", "rounds": args.rounds,
            "privacy": {"unit": "client", "epsilon": args.epsilon, "delta": args.delta}}
    arms = [("gaussian", {}), ("tree", {}), ("blt", {}), ("bandmf", {}),
            ("blt", {"min_separation": 5}), ("bandmf", {"min_separation": 5}),
            *(("bandmf", {"workload_decay": eta}) for eta in args.workload_decays)]
    rows = []
    for mechanism, extra in arms:
        values = {**base, "privacy": {**base["privacy"], "mechanism": mechanism, **extra}}
        if mechanism == "tree":
            values["participation"] = "shuffle"
            values["privacy"]["accountant"] = "rdp"
        cfg = config_from_dict(values)
        start = time.perf_counter()
        plan = client_level_plan(cfg, np.ones(args.rounds), adaptive_count=False)
        seconds = time.perf_counter() - start
        row = {"mechanism": mechanism, "workload_decay": extra.get("workload_decay", 0.0),
               "groups": plan.groups or None, "rate": plan.sample_rate,
               "sigma": plan.sigma, "sigma_times_sens": plan.sigma * plan.sensitivity, "plan_seconds": seconds,
               "strategy": None, "round_noise": None, "max_prefix_noise": None, "mean_prefix_noise": None,
               **{f"damped_noise_{eta:g}": None for eta in args.decays}}
        noising = None   # C⁻¹'s first column: the noise each round's release carries
        if mechanism == "gaussian":
            noising = np.ones(1)
        elif plan.correlated:
            coefs = plan.strategy.blt.coefs(args.rounds) if mechanism == "blt" else np.asarray(plan.strategy)
            row["strategy"] = f"{plan.strategy.buffers} buffers" if mechanism == "blt" else f"{len(coefs)} bands"
            noising = inverse_coefs(coefs, args.rounds)
        # (the tree restarts every pass: its prefixes are the pass's, none to compare)
        if noising is not None:
            scale = plan.sigma * plan.sensitivity
            err = per_query_error(noising, args.rounds)
            row["round_noise"] = float(np.linalg.norm(noising[:args.rounds]) * scale)
            row["max_prefix_noise"] = float(np.sqrt(err.max()) * scale)
            row["mean_prefix_noise"] = float(np.sqrt(err.mean()) * scale)
            for eta in args.decays:
                row[f"damped_noise_{eta:g}"] = _damped_noise(noising, args.rounds, eta) * scale
        row["plan"] = plan
        rows.append(row)
    return rows


def _damped_noise(noising: np.ndarray, rounds: int, eta: float) -> float:
    """Std of Σ_s (1 − η)^{T−s} n_s, the noise on the model after T rounds of w_t = (1 − η) w_{t−1} + release_t,
    for releases whose noise n = C⁻¹ z has first column ``noising`` (unit z)."""
    impulse = np.zeros(rounds)
    impulse[: min(rounds, len(noising))] = noising[:rounds]
    kernel = lfilter([1.0], [1.0, -(1.0 - eta)], impulse)
    return float(np.sqrt(np.sum(kernel * kernel)))


def _timed(step, repeats: int = 10) -> float:
    step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--cohort", type=int, default=50)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--params", type=int, default=2_156_490)
    p.add_argument("--decays", type=lambda v: [float(x) for x in v.split(",")], default=[0.01, 0.1],
                   help="comma-separated η for the damped_noise columns (default 0.01,0.1)")
    p.add_argument("--workload-decays", type=lambda v: [float(x) for x in v.split(",")], default=[],
                   help="comma-separated privacy.workload_decay values: a bandmf row for each (default none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = _plan_rows(args)
    draw = _timed(lambda: GaussianNoise(0, "server-dp-noise", 1).vector(args.params, 1.0))
    z = GaussianNoise(0, "server-dp-noise", 1).vector(args.params, 1.0)
    for row in rows:
        plan = row.pop("plan")
        row["stream_step_ms"] = None
        if plan.correlated:
            stream = plan.new_stream(args.params)
            row["stream_step_ms"] = _timed(lambda: stream.step(z)) * 1e3
        row["draw_ms"] = draw * 1e3
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    cols = ["mechanism", "workload_decay", "groups", "rate", "strategy", "sigma", "sigma_times_sens", "round_noise",
            "max_prefix_noise",
            "mean_prefix_noise", *(f"damped_noise_{eta:g}" for eta in args.decays), "plan_seconds", "draw_ms",
            "stream_step_ms"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else ("–" if row[c] is None else str(row[c]))
                 for c in cols]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
