"""How fast training pulls the model back from a displacement the size of one round's client-level noise.

    python experiments/bench/restoring_force.py                                  # digits, client unit
    python experiments/bench/restoring_force.py --set privacy.mechanism=bandmf --at 20 --rounds 20 --json

The correlated mechanisms (BLT, BandMF) are optimised for the noise on the prefix sums of the releases,
which is the model's noise only if nothing pulls the model back. This measures the pull in a real run.
The run (``--config``, default ``experiments/paper/client_noise_digits.yaml``, under ``privacy.unit=client``,
serial, one torch thread, planned for all its rounds) trains to round ``--at``; its state is kept and rounds ``--at`` + 1 …
``--at`` + ``--rounds`` run on. Then the state is restored, the weights are displaced by δ₀, a draw of the
same distribution as one round's noise on the mean (std σ·C/k per coordinate, or σ·sens·C/k for a
correlated mechanism: its z_t before C⁻¹), and the same rounds run again. Every random stream is keyed by
(round, client), so both continuations see the same cohorts, batches and noise: their difference δ_t is
the dynamics' response to δ₀ alone. Reported: ‖δ_t‖ / ‖δ₀‖ for each round t, and η = 1 − (‖δ_m‖/‖δ₀‖)^{1/m},
the fraction of a displacement that training removes a round (0: the model keeps every past noise draw,
as the prefix-sum workload assumes). No Ray.
"""

from __future__ import annotations

import argparse
import json
import pickle

import torch

from raysim.config import load_config
from raysim.experiment import prepare
from raysim.noise import GaussianNoise
from raysim.run_plan import plan_run
from raysim.runtime.serial import SerialExecutor, Simulation


def measure(config: str, at: int, rounds: int, overrides: list[str]) -> dict:
    cfg = load_config(config, ["privacy.unit=client", "runtime.executor=serial", "runtime.torch_threads=1",
                               *overrides])
    if at + rounds > cfg.rounds:
        raise SystemExit(f"--at {at} + --rounds {rounds} is past the run's {cfg.rounds} rounds")
    cfg = cfg.replace(eval_every=cfg.rounds)   # the planned run (σ calibrated for all its rounds), not evaluated
    torch.set_num_threads(1)
    plan = plan_run(cfg)
    train, test = prepare(plan)
    sim = Simulation(plan, train, test, SerialExecutor())
    for t in range(1, at + 1):
        sim.round(t)
    blob = pickle.dumps(sim.state())
    reference = []
    for t in range(at + 1, at + rounds + 1):
        sim.round(t)
        reference.append(sim.weights.double().clone())
    sim.restore(blob)
    client_level = sim.server.ctx.client_level
    clip = float(sim.server.clip_norm(at + 1))
    std = (client_level.correlated_noise_std(clip) if client_level.correlated
           else client_level.update_noise_std(at + 1, clip))
    delta0 = GaussianNoise(cfg.train_seed, "restoring-force", at).vector(sim.weights.numel(), std).double()
    sim.weights = (sim.weights.double() + delta0).to(sim.weights.dtype)
    start = float((sim.weights.double() - pickle.loads(blob)["weights"].double()).norm())   # δ₀ as stored
    ratios = []
    for i, t in enumerate(range(at + 1, at + rounds + 1)):
        sim.round(t)
        ratios.append(float((sim.weights.double() - reference[i]).norm()) / start)
    return {"mechanism": cfg.privacy.mechanism, "at": at, "rounds": rounds, "params": sim.weights.numel(),
            "noise_std": std, "delta0_norm": start, "ratios": ratios,
            "eta": 1.0 - ratios[-1] ** (1.0 / rounds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/paper/client_noise_digits.yaml")
    p.add_argument("--at", type=int, default=30, help="the round after which the model is displaced")
    p.add_argument("--rounds", type=int, default=10, help="rounds run on after the displacement")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    row = measure(args.config, args.at, args.rounds, args.set)
    if args.json:
        print(json.dumps(row, indent=1))
        return
    print(f"{row['mechanism']}: displaced after round {row['at']} by ‖δ₀‖ = {row['delta0_norm']:.4g} "
          f"({row['params']} parameters, std {row['noise_std']:.4g}); η = {row['eta']:.4f} a round")
    print("| rounds after | " + " | ".join(str(i + 1) for i in range(row["rounds"])) + " |")
    print("|---|" + "---|" * row["rounds"])
    print("| ‖δ_t‖ / ‖δ₀‖ | " + " | ".join(f"{r:.3f}" for r in row["ratios"]) + " |")


if __name__ == "__main__":
    main()
