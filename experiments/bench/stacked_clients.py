"""Clients trained one after another against clients stacked into one computation (``torch.func.vmap``).

    python experiments/bench/stacked_clients.py [--clients 25] [--threads 1] [--repeats 5] [--json]

A client actor of the cross-device workload trains its share of a round's cohort (25 of 50 clients
on 2 cores) one client at a time: each client starts from the round's weights and takes 5 plain SGD
steps at batch 10 on the paper CNN (3×32×32 inputs, channels-last, as a client actor keeps them).
The stacked alternative trains the same clients as one model with a leading client dimension: their
parameters stacked, ``vmap(grad(loss))`` over clients (``torch.func.functional_call``), which turns
each convolution into one grouped convolution and each linear layer into one batched product, and
one update of the stacked parameters a step. Both see the same batches (random inputs, seeded).

Timed alternately, ``--repeats`` times each after one warm-up pass, at ``--threads`` torch threads
(1: one client actor's share of the 2-core VM); samples/s = clients × steps × batch / median time.
The stacked result is checked against the loop's (max |Δw|, float32 summation order differs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from raysim.models.cnn import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=25)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k, steps, b = args.clients, args.steps, args.batch_size
    model = build_model(3, 32, 10)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(k, steps, b, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (k, steps, b), generator=gen)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = list(model.parameters())

    def one_by_one() -> dict[str, torch.Tensor]:
        ends = []
        for c in range(k):
            with torch.no_grad():
                for p, n in zip(params, start):
                    p.copy_(start[n])
            for s in range(steps):
                for p in params:
                    p.grad = None
                F.cross_entropy(model(x[c, s].contiguous(memory_format=torch.channels_last)), y[c, s]).backward()
                with torch.no_grad():
                    for p in params:
                        p.add_(p.grad, alpha=-args.lr)
            ends.append([p.detach().clone() for p in params])
        return {n: torch.stack([e[i] for e in ends]) for i, n in enumerate(start)}

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    stacked_grad = vmap(grad(loss))

    def stacked() -> dict[str, torch.Tensor]:
        p = {n: v.unsqueeze(0).expand(k, *v.shape).clone() for n, v in start.items()}
        for s in range(steps):
            g = stacked_grad(p, x[:, s], y[:, s])
            p = {n: p[n] - args.lr * g[n] for n in p}
        return p

    arms = {"one client at a time": one_by_one, "stacked (vmap over clients)": stacked}
    times: dict[str, list[float]] = {name: [] for name in arms}
    ends = {}
    for r in range(args.repeats + 1):
        for name, fn in arms.items():
            t = time.perf_counter()
            ends[name] = fn()
            if r:   # the first pass warms up
                times[name].append(time.perf_counter() - t)
    loop, stack = ends.values()
    max_diff = max(float((loop[n] - stack[n]).abs().max()) for n in loop)
    samples = k * steps * b
    rows = [{"arm": name, "median_s": statistics.median(ts), "samples_per_s": samples / statistics.median(ts)}
            for name, ts in times.items()]
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["ratio"] = row["samples_per_s"] / base
    out = {"clients": k, "steps": steps, "batch_size": b, "threads": args.threads, "repeats": args.repeats,
           "max_abs_weight_difference": max_diff, "rows": rows}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{k} clients × {steps} steps × batch {b}, paper CNN, {args.threads} thread(s), median of {args.repeats}\n")
    print("| arm | median (s) | samples/s | × one at a time |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['arm']} | {row['median_s']:.3f} | {row['samples_per_s']:.1f} | {row['ratio']:.2f} |")
    print(f"\nmax |w_stacked − w_loop| over all clients' weights: {max_diff:.2e}")


if __name__ == "__main__":
    main()
