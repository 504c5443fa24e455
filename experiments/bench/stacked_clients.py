"""One client actor's share of a cross-device round, trained one client at a time, stacked, or compiled.

    python experiments/bench/stacked_clients.py [--clients 25] [--threads 1] [--repeats 5] [--arms ...] [--json]

A client actor of the cross-device workload trains its share of a round's cohort (25 of 50 clients
on 2 cores) one client at a time: each client starts from the round's weights and takes 5 plain SGD
steps at batch 10 on the paper CNN (3×32×32 inputs, channels-last, as a client actor keeps them).
Arms (``--arms``, all three by default):

- ``loop``: that, in eager PyTorch.
- ``stacked``: the same clients trained as one model with a leading client dimension: their
  parameters stacked, ``vmap(grad(loss))`` over clients (``torch.func.functional_call``), which turns
  each convolution into one grouped convolution and each linear layer into one batched product, and
  one update of the stacked parameters a step.
- ``compiled``: the loop with the model under ``torch.compile`` (Inductor, default mode); its first
  pass, which compiles the forward and backward graphs, is reported as ``first_pass_s``.

All arms see the same batches (random inputs, seeded). Timed alternately, ``--repeats`` times each
after one warm-up pass, at ``--threads`` torch threads (1: one client actor's share of the 2-core
VM); samples/s = clients × steps × batch / median time. Each arm's weights are checked against the
loop's (max |Δw|; the float32 summation order differs). The compute each arm does is put in
GFLOP/s (the forward and backward FLOPs of one batch, counted by
``torch.utils.flop_counter.FlopCounterMode``) beside a float32 matmul of 1024×1024 matrices at the
same thread count, the machine's dense-compute speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap
from torch.utils.flop_counter import FlopCounterMode

from raysim.models.cnn import build_model

ARMS = ("loop", "stacked", "compiled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=25)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--arms", default=",".join(ARMS),
                    help="comma-separated, from loop, stacked, compiled (the loop is always run: the others are checked against it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    wanted = {a.strip() for a in args.arms.split(",") if a.strip()}
    if not wanted <= set(ARMS):
        ap.error(f"--arms: unknown arm(s) {sorted(wanted - set(ARMS))}; choose from {', '.join(ARMS)}")
    torch.set_num_threads(args.threads)
    k, steps, b = args.clients, args.steps, args.batch_size
    model = build_model(3, 32, 10)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(k, steps, b, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (k, steps, b), generator=gen)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = list(model.parameters())

    def one_by_one(net: torch.nn.Module) -> dict[str, torch.Tensor]:
        ends = []
        for c in range(k):
            with torch.no_grad():
                for p, n in zip(params, start):
                    p.copy_(start[n])
            for s in range(steps):
                for p in params:
                    p.grad = None
                F.cross_entropy(net(x[c, s].contiguous(memory_format=torch.channels_last)), y[c, s]).backward()
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

    arms = {"one client at a time": lambda: one_by_one(model)}
    if "stacked" in wanted:
        arms["stacked (vmap over clients)"] = stacked
    if "compiled" in wanted:
        compiled = torch.compile(model)
        arms["one client at a time, torch.compile"] = lambda: one_by_one(compiled)
    times: dict[str, list[float]] = {name: [] for name in arms}
    first: dict[str, float] = {}
    ends = {}
    for r in range(args.repeats + 1):
        for name, fn in arms.items():
            t = time.perf_counter()
            ends[name] = fn()
            if r:   # the first pass warms up (and compiles)
                times[name].append(time.perf_counter() - t)
            else:
                first[name] = time.perf_counter() - t
    loop = ends["one client at a time"]
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x[0, 0].contiguous(memory_format=torch.channels_last)), y[0, 0]).backward()
    flops_per_sample = counter.get_total_flops() / b
    a = torch.randn(1024, 1024, generator=gen)
    matmul = []
    for _ in range(10):
        t = time.perf_counter()
        a @ a
        matmul.append(time.perf_counter() - t)
    matmul_gflops = 2 * 1024 ** 3 / statistics.median(matmul[2:]) / 1e9
    samples = k * steps * b
    rows = []
    for name, ts in times.items():
        rate = samples / statistics.median(ts)
        rows.append({"arm": name, "median_s": statistics.median(ts), "samples_per_s": rate,
                     "first_pass_s": first[name], "gflops_per_s": rate * flops_per_sample / 1e9,
                     "max_abs_weight_difference": max(float((loop[n] - ends[name][n]).abs().max()) for n in loop)})
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["ratio"] = row["samples_per_s"] / base
        row["of_matmul_speed"] = row["gflops_per_s"] / matmul_gflops
    out = {"clients": k, "steps": steps, "batch_size": b, "threads": args.threads, "repeats": args.repeats,
           "gflop_per_sample": flops_per_sample / 1e9, "matmul_gflops_per_s": matmul_gflops, "rows": rows}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{k} clients × {steps} steps × batch {b}, paper CNN, {args.threads} thread(s), median of {args.repeats}; "
          f"{flops_per_sample / 1e9:.4f} GFLOP a sample (forward and backward)\n")
    print("| arm | median (s) | samples/s | × one at a time | GFLOP/s | × matmul | first pass (s) | max abs Δw vs the loop |\n"
          "|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['arm']} | {row['median_s']:.3f} | {row['samples_per_s']:.1f} | {row['ratio']:.2f} | "
              f"{row['gflops_per_s']:.1f} | {row['of_matmul_speed']:.2f} | {row['first_pass_s']:.2f} | "
              f"{row['max_abs_weight_difference']:.2e} |")
    print(f"\nfloat32 matmul, 1024×1024 at {args.threads} thread(s): {matmul_gflops:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
