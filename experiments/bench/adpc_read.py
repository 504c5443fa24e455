"""How well the server reads a cohort's quantile from ADPC's noised histograms: ``adpc.read`` × bins.

A synthetic cohort shaped like the quickstart's: N clients of 30–60 examples each (the examples a
digits client sees in a round), per-example norms log-normal (σ_log = 0.8) around a true median, noise
N(0, σ_h²) in every cell. For each read rule and bin count it prints the median over trials of
read / true pooled median and of |log(read / true)|. No training: numpy only, a few seconds.

    python experiments/bench/adpc_read.py [--clients 10] [--sigma-h 25] [--trials 200]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from raysim.algorithms.clip_rules import (
    example_norm_histogram, histogram_edges, histogram_quantile, pooled_histogram_quantile,
)


def trial(rng: np.random.Generator, edges: np.ndarray, clients: int, true_median: float,
          sigma_h: float) -> tuple[float, float]:
    """log(read / truth) of the pooled read and of the median of the per-client reads."""
    hists, norms = [], []
    for n in rng.integers(30, 60, size=clients):
        x = np.exp(rng.normal(math.log(true_median), 0.8, n))
        norms.append(x)
        h = example_norm_histogram(x, edges)
        hists.append(h + rng.normal(0.0, sigma_h, h.shape))
    truth = math.log(float(np.median(np.concatenate(norms))))
    pooled = math.log(pooled_histogram_quantile(hists, edges, 0.5)) - truth
    per_client = math.log(float(np.nanmedian([histogram_quantile(h, edges, 0.5) for h in hists]))) - truth
    return pooled, per_client


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--sigma-h", type=float, default=25.0)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| bins | true median | pooled: read/true | pooled: |log err| | per_client: read/true | per_client: |log err| |")
    print("|---|---|---|---|---|---|")
    for bins in (48, 24, 12, 6):
        edges = histogram_edges(bins, 1e-3, 1e3)
        for true_median in (1.0, 10.0):
            errs = np.array([trial(rng, edges, args.clients, true_median, args.sigma_h) for _ in range(args.trials)])
            med = np.median(errs, axis=0)
            abs_med = np.median(np.abs(errs), axis=0)
            print(f"| {bins} | {true_median:g} | {math.exp(med[0]):.2f} | {abs_med[0]:.2f} | "
                  f"{math.exp(med[1]):.2f} | {abs_med[1]:.2f} |")


if __name__ == "__main__":
    main()
