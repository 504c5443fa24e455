"""Where one DP-SGD step of the ``bk`` engine spends its time, phase by phase and layer by layer,
next to plain SGD's forward and backward on the same model and batches.

    python experiments/bench/engine_profile.py [--threads 2] [--model cnn] [--lldm] [--steps 25] [--cpu-time]
        [--no-malloc-tuning]

It replays the engine's phases (noise, forward with hooks, backward to the layer outputs, each
layer's per-example norms, clip factors, each layer's clipped sum added to the noise, optimiser
step) with the engine's own per-layer code, alternating with a plain step; min and median over
the timed steps (the first 3 dropped). ``--cpu-time`` uses the calling thread's CPU time instead of wall time,
which a loaded machine disturbs less (meaningful with ``--threads 1`` only).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from raysim.allocator import tune_malloc
from raysim.config import MODEL_NAMES
from raysim.models import build_backbone, init_parameters
from raysim.privacy.grad_sample import _channels_last, clip_factors, parametrised_layers
from raysim.privacy.layer_grads import LayerStats
from raysim.rng import torch_generator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", choices=MODEL_NAMES, default="cnn")
    parser.add_argument("--lldm", action="store_true")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cpu-time", action="store_true")
    parser.add_argument("--no-malloc-tuning", dest="malloc_tuning", action="store_false",
                        help="keep glibc's default malloc thresholds (default: raysim's, as in dp_step.py)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.malloc_tuning:
        tune_malloc()
    clock = time.thread_time if args.cpu_time else time.perf_counter
    model = build_backbone(args.model, 3, 32, 10, lldm=args.lldm)
    init_parameters(model, torch_generator(0, "model-init"))
    gen = torch_generator(0, "bench_data")
    batches = [(torch.randn(args.batch_size, 3, 32, 32, generator=gen),
                torch.randint(0, 10, (args.batch_size,), generator=gen)) for _ in range(4)]
    layers = parametrised_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    noise_gen = torch_generator(0, "bench_noise")
    times: dict[str, list[float]] = defaultdict(list)

    def lap(key: str, start: float) -> float:
        now = clock()
        times[key].append((now - start) * 1e3)
        return now

    def dp_step(x, y):
        # privatize's order: the noise (σC/B, σ = C = 1) first, then the engine adds (c_i/B)·g_i into it
        t = clock()
        params = list(model.parameters())
        scale = 1.0 / x.shape[0]
        noise = {id(p): torch.empty(p.shape).normal_(0.0, scale, generator=noise_gen) for p in params}
        t = lap("noise", t)
        records = {id(m): [] for m in layers}
        hooks = [m.register_forward_hook(lambda mod, i, o: records[id(mod)].append((i[0].detach(), o)))
                 for m in layers]
        loss = F.cross_entropy(model(_channels_last(x)), y, reduction="sum")
        for h in hooks:
            h.remove()
        t = lap("bk: forward with hooks", t)
        outputs = [out for m in layers for _, out in records[id(m)]]
        grads = iter(torch.autograd.grad(loss, outputs))
        t = lap("bk: backward to layer outputs", t)
        with torch.no_grad():
            pairs = {id(m): [(a, next(grads)) for a, _ in records[id(m)]] for m in layers}
            stats = []
            for m in layers:
                stats.append(LayerStats(m, pairs[id(m)], x.shape[0], torch.float32, x.device))
                t = lap(f"norms {names[id(m)]}", t)
            factors, _ = clip_factors(torch.stack([s.sq_norm for s in stats], 1).sqrt(), 1.0)
            factors = factors * scale
            t = lap("clip factors", t)
            for k, s in enumerate(stats):
                into = {pname: noise[id(p)] for pname, p in s.layer.named_parameters(recurse=False)}
                for pname, value in s.clipped_sums(factors[:, k].contiguous(), into).items():
                    getattr(s.layer, pname).grad = value
                t = lap(f"clipped sum {names[id(s.layer)]}", t)
        opt.step()
        lap("optimiser step", t)

    def plain_step(x, y):
        t = clock()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        t = lap("plain: forward", t)
        F.cross_entropy(out, y).backward()
        t = lap("plain: backward", t)
        opt.step()
        lap("plain: optimiser step", t)

    for i in range(args.steps + 3):
        for key, step in (("TOTAL bk DP step", dp_step), ("TOTAL plain step", plain_step)):
            start = clock()
            step(*batches[i % len(batches)])
            times[key].append((clock() - start) * 1e3)
    unit = "CPU ms" if args.cpu_time else "ms"
    print(f"{args.model}{' + LLDM' if args.lldm else ''}, batch {args.batch_size}, {args.threads} threads, "
          f"{args.steps} steps, {unit}\n\n| phase | min | median |\n|---|---|---|")
    for key, values in times.items():
        values = values[3:]
        print(f"| {key} | {min(values):.2f} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
