"""One round's privacy accounting: the time ``PrivacyLedger.epsilon()`` takes after each round's record.

A client ledger records each round's DP-SGD steps (``--steps`` at Poisson rate ``--q``) and one plain
Gaussian side channel (σ = 20), then evaluates ε at δ = 1e-5, for ``--rounds`` rounds. ``constant``
keeps σ = ``--sigma``; ``decaying`` multiplies it by 0.97 each round (DP-ACDN's shape), so every round adds
a new event. Reported: the median over rounds 2.. of one evaluation (round 1 builds the caches), the
total, and the final ε, for each accountant.

    python experiments/bench/accounting_round.py [--rounds 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from raysim.privacy.accounting import ACCOUNTANTS, PrivacyLedger, StepEvent


def measure(accountant: str, schedule: str, rounds: int, q: float, sigma: float, steps: int) -> dict:
    ledger = PrivacyLedger(1e-5, accountant)
    times = []
    for t in range(rounds):
        s = sigma if schedule == "constant" else sigma * 0.97**t
        ledger.record(StepEvent(q, s, steps))
        ledger.record(StepEvent(1.0, 20.0, 1))
        start = time.perf_counter()
        eps = ledger.epsilon()
        times.append(time.perf_counter() - start)
    return {"accountant": accountant, "schedule": schedule, "rounds": rounds,
            "median_round_ms": 1000 * statistics.median(times[1:] or times), "total_s": sum(times), "epsilon": eps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--q", type=float, default=0.0128)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=70)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [measure(a, s, args.rounds, args.q, args.sigma, args.steps)
            for s in ("constant", "decaying") for a in ACCOUNTANTS]
    if args.json:
        print(json.dumps(rows))
        return
    print("| accountant | σ schedule | median ms / round | total s | final ε |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['accountant']} | {r['schedule']} | {r['median_round_ms']:.1f} | {r['total_s']:.2f} | "
              f"{r['epsilon']:.4f} |")


if __name__ == "__main__":
    main()
