"""BandMF on one client's DP-SGD steps against independent DP-SGD noise, at the same ε: where the noise goes.

    python experiments/bench/step_noise.py                          # the quickstart's median client
    python experiments/bench/step_noise.py --examples 500 --min-separation 8 --json

A client with ``--examples`` training examples runs τ = E·⌈n/B⌉ DP-SGD steps a round for the config's
rounds (``--config``, default the offline quickstart: B = 16, E = 1, 20 rounds, ε = 8 at δ = 1e-5). Each
mechanism's σ is calibrated as a run calibrates it (the mechanism's ``example_steps`` and
:func:`raysim.privacy.plan.plan_noise`), and its strategy is the one the client runs. From the strategy,
in units of C/B (clip norm over batch) and over the client's S = τ × rounds steps:

- ``step``: the largest noise on one step's gradient (σ times the largest row norm of C⁻¹);
- ``round_update``: the noise on one round's update (the sum of its τ steps), the round's RMS;
- ``prefix_all``: the noise on the prefix sums after every step (what the strategy is optimised for), RMS;
- ``prefix_round_end``: the noise on the prefix sums at the ends of rounds, RMS: the noise the released
  models carry, which is all a federated run shows anyone.

``bandmf-round-end`` is BandMF with the strategy optimised for the round-end prefix sums alone (the same
bands and accounting), to show whether optimising for what federated training releases changes anything;
``--workload-decay η`` adds BandMF with ``privacy.workload_decay: η``.
numpy, scipy and dp-accounting only: no data, no training.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from raysim.algorithms.registry import get_method
from raysim.config import load_config
from raysim.privacy.mechanisms.bandmf import optimize_bandmf
from raysim.privacy.mechanisms.registry import get_mechanism
from raysim.privacy.mechanisms.toeplitz import inverse_coefs
from raysim.privacy.plan import plan_noise, resolve_clipping


def _noise(coefs: np.ndarray, n: int, tau: int, sigma: float) -> dict[str, float]:
    """The four noise measures of the strategy ``coefs`` at multiplier σ (unit-norm columns: sensitivity 1)."""
    h = inverse_coefs(coefs, n)                          # C⁻¹'s first column: step t's noise is Σ_j h_j z_{t−j}
    g = np.cumsum(h)                                     # A C⁻¹'s first column
    prefix = np.cumsum(g * g)                            # variance of the prefix sum after each step
    ends = np.arange(tau - 1, n, tau)
    # round r's update is the prefix after its last step minus the prefix before its first: row differences
    # of A C⁻¹, whose entries are g_{e−j} − g_{s−1−j}
    rounds = []
    for e in ends:
        s = e - tau + 1
        row = g[e::-1].copy()
        if s > 0:
            row[e - s + 1:] -= g[s - 1::-1]
        rounds.append(float(row @ row))
    return {"step": sigma * float(np.sqrt(np.cumsum(h * h)).max()),
            "round_update": sigma * math.sqrt(float(np.mean(rounds))),
            "prefix_all": sigma * math.sqrt(float(prefix.mean())),
            "prefix_round_end": sigma * math.sqrt(float(prefix[ends].mean()))}


def rows_for(config: str, examples: int, min_separation: int, overrides: list[str],
             workload_decay: float = 0.0) -> list[dict]:
    fedsa = ["method=fedsa", "privacy.unit=example", *overrides]
    bandmf = ["privacy.mechanism=bandmf", f"privacy.min_separation={min_separation}"]
    damped = bandmf + [f"privacy.workload_decay={workload_decay}"]
    rows = []
    arms = [("gaussian", []), ("bandmf", bandmf), ("bandmf-round-end", bandmf)]
    if workload_decay:
        arms.append((f"bandmf-decay-{workload_decay:g}", damped))
    for label, sets in arms:
        cfg = load_config(config, fedsa + sets)
        spec = get_method(cfg.method)
        tau = cfg.local_epochs * math.ceil(examples / cfg.batch_size)
        n = tau * cfg.rounds
        mechanism = get_mechanism(cfg.privacy.mechanism)
        steps = mechanism.example_steps(cfg, examples, tau)
        sigma = float(plan_noise(spec, cfg, resolve_clipping(spec, cfg), np.array([steps.rate]),
                                 np.array([steps.events]))[0])
        if label == "gaussian":
            coefs = np.ones(1)
        elif label == "bandmf-round-end":
            coefs = optimize_bandmf(n, steps.bands, released=np.arange(tau - 1, n, tau))
        else:
            coefs = np.asarray(mechanism.client_strategy(cfg, n, steps.bands))
        rows.append({"mechanism": label, "examples": examples, "tau": tau, "steps": n, "bands": steps.bands,
                     "rate": steps.rate, "events": steps.events * cfg.rounds, "sigma": sigma,
                     "coefs": [round(float(c), 4) for c in coefs], **_noise(coefs, n, tau, sigma)})
    ref = rows[0]
    for row in rows:
        for key in ("step", "round_update", "prefix_all", "prefix_round_end"):
            row[f"{key}_ratio"] = row[key] / ref[key]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/quickstart.yaml")
    p.add_argument("--examples", type=int, default=93, help="the client's training examples (default: the "
                   "quickstart's median client)")
    p.add_argument("--min-separation", type=int, default=4, help="privacy.min_separation: the cap on the bands")
    p.add_argument("--workload-decay", type=float, default=0.0,
                   help="adds a bandmf row with this privacy.workload_decay (default: none)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = rows_for(args.config, args.examples, args.min_separation, args.set, args.workload_decay)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    r = rows[0]
    print(f"n = {r['examples']} examples, τ = {r['tau']} steps a round, S = {r['steps']} steps; noise in units of C/B; "
          "ratio to independent noise in brackets")
    cols = ["step", "round_update", "prefix_all", "prefix_round_end"]
    print("| mechanism | bands | rate | events | σ | coefs | " + " | ".join(cols) + " |")
    print("|" + "---|" * (6 + len(cols)))
    for row in rows:
        cells = [f"{row[c]:.3f} ({row[c + '_ratio']:.3f})" for c in cols]
        print(f"| {row['mechanism']} | {row['bands']} | {row['rate']:.3f} | {row['events']} | {row['sigma']:.3f} | "
              f"{', '.join(f'{c:.3f}' for c in row['coefs'][:6])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
