"""Throughput of one DP training step, per gradient engine, against plain SGD in the same run.

    python experiments/bench/dp_step.py [--json] [--steps N] [--batch-size 64] [--threads T] [--lldm]
        [--model cnn|resnet18_gn|wrn16_4|leaf_cnn|char_lstm] [--engines plain,bk,...] [--no-malloc-tuning]
        [--profile]

Each engine trains its own copy of the same initial model on the same seeded random batches
(3x32x32 images of 10 classes; for ``leaf_cnn`` 1x28x28 of 62 classes, FEMNIST's shape; for
``char_lstm`` windows of 80 token ids over a vocabulary of 80 labelled with one of them, the shape
of LEAF's Shakespeare task): warm-up steps first, then timed steps, the engines taking turns step by
step in a seeded random order that changes every round; samples/s = B / median step time (the
JSON also has B / mean step time). Minor page faults per step are the process's, counted around
each timed step.
An engine that cannot run the model is reported as "unsupported: <reason>", not a crash.

``--profile`` instead times the phases of raysim's per-sample step (``privatize`` with the ``bk``
engine, as local training calls it): the noise draw, then the engine's own phases as it reports
them through its ``on_phase`` hook (forward, backward to the layer outputs, each layer's per-example
norms, the clip factors, each layer's clipped sum), then the optimiser step; and, in turn with each
of its steps, the forward pass, backward pass and optimiser step of plain SGD in channels-last on
the same batch; min and median over the timed steps.

The process runs with the glibc malloc settings raysim applies wherever it trains
(:func:`raysim.allocator.tune_malloc`, ``runtime.malloc_tuning``), plain SGD included;
``--no-malloc-tuning`` measures glibc's defaults instead. It also runs with the OpenMP spin count
the ``raysim`` command sets (:func:`raysim.allocator.spin_less`) unless ``GOMP_SPINCOUNT`` is set:
``GOMP_SPINCOUNT=300000 python experiments/bench/dp_step.py ...`` measures libgomp's default. These
settings are per process, so they cannot be compared in one run: compare runs, and the ratios within each. ``--cpu-time`` times with
the process's CPU time instead of the wall clock: on a machine shared with other work, at 1 thread,
it measures the work itself.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import resource
import statistics
import time
import warnings
from collections.abc import Callable

from raysim.allocator import spin_less, tune_malloc

spin_less()        # as the raysim command does: libgomp reads it when torch loads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from raysim.config import MODEL_NAMES  # noqa: E402
from raysim.models import build_backbone  # noqa: E402
from raysim.privacy.clipping import privatize  # noqa: E402
from raysim.privacy.grad_sample import make_engine  # noqa: E402
from raysim.noise import GaussianNoise  # noqa: E402
from raysim.rng import torch_generator  # noqa: E402

CLIP_NORM, NOISE_MULTIPLIER, LR = 1.0, 1.0, 0.01

#: The inputs each model is timed on: ("images", (C, H, W), classes) or ("tokens", (T,), vocabulary).
INPUTS = {"leaf_cnn": ("images", (1, 28, 28), 62), "char_lstm": ("tokens", (80,), 80)}
DEFAULT_INPUT = ("images", (3, 32, 32), 10)


def _inputs(model: str) -> tuple[str, tuple[int, ...], int]:
    return INPUTS.get(model, DEFAULT_INPUT)


def _batches(args: argparse.Namespace) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four seeded random batches of the model's inputs (:data:`INPUTS`)."""
    kind, shape, classes = _inputs(args.model)
    gen = torch_generator(args.seed, "bench_data")
    if kind == "tokens":
        return [(torch.randint(0, classes, (args.batch_size, *shape), generator=gen),
                 torch.randint(0, classes, (args.batch_size,), generator=gen)) for _ in range(4)]
    return [(torch.randn(args.batch_size, *shape, generator=gen),
             torch.randint(0, classes, (args.batch_size,), generator=gen)) for _ in range(4)]


def _backbone(args: argparse.Namespace) -> nn.Module:
    _, shape, classes = _inputs(args.model)
    return build_backbone(args.model, shape[0], shape[-1], classes, lldm=args.lldm)

#: The clock every step and phase is timed with: wall time, or with ``--cpu-time`` this process's CPU
#: time, which a shared machine's load leaves nearly alone at 1 thread (at 2 threads it also counts
#: the threads' spin-waits).
CLOCK = [time.perf_counter]

Step = Callable[[torch.Tensor, torch.Tensor], None]


def _plain(model: nn.Module, args) -> Step:
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _raysim(mode: str, engine_name: str) -> Callable[[nn.Module, argparse.Namespace], Step]:
    def factory(model: nn.Module, args) -> Step:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        engine = make_engine(engine_name)
        steps = itertools.count()

        def step(x, y):
            out = privatize(model, x, y, mode=mode, clip_norm=CLIP_NORM, noise_multiplier=NOISE_MULTIPLIER,
                            expected_batch_size=args.batch_size, noise=GaussianNoise(args.seed, "bench_noise", next(steps)),
                            engine=engine)
            for p, g in zip(model.parameters(), out.grads):
                p.grad = g
            opt.step()
        return step
    return factory


def _opacus(grad_sample_mode: str) -> Callable[[nn.Module, argparse.Namespace], Step]:
    def factory(model: nn.Module, args) -> Step:
        from opacus import PrivacyEngine

        kind, shape, _ = _inputs(args.model)
        data = torch.utils.data.TensorDataset(
            torch.zeros(args.batch_size * 4, *shape, dtype=torch.long if kind == "tokens" else torch.float32),
            torch.zeros(args.batch_size * 4, dtype=torch.long))
        loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        engine = PrivacyEngine(accountant="rdp")
        made = engine.make_private(module=model, optimizer=opt, data_loader=loader, criterion=nn.CrossEntropyLoss(),
                                   noise_multiplier=NOISE_MULTIPLIER, max_grad_norm=CLIP_NORM, poisson_sampling=False,
                                   grad_sample_mode=grad_sample_mode,
                                   noise_generator=torch_generator(args.seed, "bench_noise"))
        if grad_sample_mode == "ghost":
            private_model, dp_opt, criterion, _ = made
        else:
            private_model, dp_opt, _ = made
            criterion = nn.CrossEntropyLoss()

        def step(x, y):
            dp_opt.zero_grad(set_to_none=True)
            criterion(private_model(x), y).backward()
            dp_opt.step()
        return step
    return factory


def _plain_channels_last(model: nn.Module, args) -> Step:
    """Plain SGD in the NHWC layout the ``bk`` engine runs its forward pass in: the fairer baseline
    wherever it is faster than the default layout."""
    model = model.to(memory_format=torch.channels_last)
    step = _plain(model, args)
    return lambda x, y: step(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x, y)


#: (key for --engines, row name, step factory); the first, plain SGD, is the reference and always runs.
ENGINES: list[tuple[str, str, Callable[[nn.Module, argparse.Namespace], Step]]] = [
    ("plain", "plain SGD (no DP)", _plain),
    ("plain-cl", "plain SGD (no DP), channels-last", _plain_channels_last),
    ("batch", "raysim batch clipping", _raysim("batch", "bk")),
    ("bk", "raysim per-sample (bk)", _raysim("per_sample", "bk")),
    ("vmap", "raysim per-sample (vmap)", _raysim("per_sample", "vmap")),
    ("opacus-hooks", "opacus hooks", _opacus("hooks")),
    ("opacus-ghost", "opacus ghost", _opacus("ghost")),
]


def _reason(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text[:160]}"


def run(args: argparse.Namespace) -> list[dict]:
    """Warm up every engine, then time them in rounds, one step each per round in a shuffled order,
    so that a change in machine load hits all engines alike; samples/s uses the median step time."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tuned = tune_malloc() if args.malloc_tuning else False
    batches = _batches(args)
    init = _backbone(args)
    engines = [e for e in ENGINES if e[0] == "plain" or e[0] in args.engines]
    rows = [{"engine": name, "key": key, "model": args.model, "lldm": args.lldm, "threads": torch.get_num_threads(),
             "batch_size": args.batch_size, "samples_per_s": None, "mean_samples_per_s": None, "median_step_ms": None,
             "malloc_tuning": tuned, "minor_faults_per_step": None, "ratio_to_plain": None, "error": None}
            for key, name, _ in engines]
    steps: dict[int, Step] = {}
    times: dict[int, list[float]] = {}
    faults: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, (_, _, factory) in enumerate(engines):
            try:
                step = factory(copy.deepcopy(init), args)
                for i in range(args.warmup):
                    step(*batches[i % len(batches)])
                steps[k], times[k], faults[k] = step, [], 0
            except Exception as err:  # a benchmark row, not a crash: report why the engine cannot run
                rows[k]["error"] = f"unsupported: {_reason(err)}"
        order = random.Random(args.seed)
        for i in range(args.steps):
            # A fresh order each round: no engine always follows the same one (a step right after a
            # memory-hungry engine's runs slower, whichever engine it is).
            turn = list(steps)
            order.shuffle(turn)
            for k in turn:
                faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = CLOCK[0]()
                try:
                    steps[k](*batches[i % len(batches)])
                except Exception as err:
                    rows[k]["error"] = f"unsupported: {_reason(err)}"
                    del steps[k]
                    continue
                times[k].append(CLOCK[0]() - start)
                faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted
    for k in steps:
        rows[k]["samples_per_s"] = args.batch_size / statistics.median(times[k])
        rows[k]["median_step_ms"] = statistics.median(times[k]) * 1e3
        rows[k]["mean_samples_per_s"] = args.batch_size * len(times[k]) / sum(times[k])
        rows[k]["minor_faults_per_step"] = faults[k] / len(times[k])
    plain = rows[0]["samples_per_s"]
    for row in rows:
        if row["samples_per_s"] is not None and plain:
            row["ratio_to_plain"] = row["samples_per_s"] / plain
    return rows


def _markdown(rows: list[dict]) -> str:
    lines = ["| engine | samples/s | median step (ms) | ratio to plain SGD | minor page faults / step |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['engine']} | {r['error']} | | | |")
        else:
            lines.append(f"| {r['engine']} | {r['samples_per_s']:.1f} | {r['median_step_ms']:.1f} | "
                         f"{r['ratio_to_plain']:.2f} | {r['minor_faults_per_step']:.0f} |")
    return "\n".join(lines)


def profile(args: argparse.Namespace) -> list[dict]:
    """Phase times (ms) of the real per-sample DP step, through the ``bk`` engine's ``on_phase`` hook,
    and, step by step in turn with it, of plain SGD in channels-last on the same batches."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.malloc_tuning:
        tune_malloc()
    batches = _batches(args)
    model = _backbone(args)
    plain = copy.deepcopy(model).to(memory_format=torch.channels_last)
    opt, plain_opt = torch.optim.SGD(model.parameters(), lr=LR), torch.optim.SGD(plain.parameters(), lr=LR)
    engine = make_engine("bk")
    times: dict[str, list[float]] = {}
    clock = {"t": 0.0}

    def lap(phase: str) -> None:
        now = CLOCK[0]()
        times.setdefault(phase, []).append((now - clock["t"]) * 1e3)
        clock["t"] = now

    real = engine.clipped_sum

    def entered(*a, **kw):      # the noise is drawn before privatize hands the batch to the engine
        lap("noise")
        return real(*a, **kw)

    engine.clipped_sum = entered
    engine.on_phase = lap
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            times.clear()
        x, y = batches[i % len(batches)]
        start = clock["t"] = CLOCK[0]()
        out = privatize(model, x, y, mode="per_sample", clip_norm=CLIP_NORM, noise_multiplier=NOISE_MULTIPLIER,
                        expected_batch_size=args.batch_size, noise=GaussianNoise(args.seed, "bench_noise", i),
                        engine=engine)
        for p, g in zip(model.parameters(), out.grads):
            p.grad = g
        opt.step()
        lap("optimiser step")
        times.setdefault("TOTAL DP step", []).append((CLOCK[0]() - start) * 1e3)

        start = clock["t"] = CLOCK[0]()
        plain_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(plain(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x), y)
        lap("plain SGD, channels-last: forward")
        loss.backward()
        lap("plain SGD, channels-last: backward, weight gradients included")
        plain_opt.step()
        lap("plain SGD, channels-last: optimiser step")
        times.setdefault("TOTAL plain SGD step, channels-last", []).append((CLOCK[0]() - start) * 1e3)
    return [{"phase": k, "min_ms": min(v), "median_ms": statistics.median(v)} for k, v in times.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a markdown table")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per engine")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per engine first")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--lldm", action="store_true", help="use the FedDimDP (LLDM) model")
    parser.add_argument("--model", choices=MODEL_NAMES, default="cnn", help="backbone (default: the paper CNN)")
    parser.add_argument("--engines", default=",".join(key for key, _, _ in ENGINES),
                        help="comma-separated subset of " + ", ".join(key for key, _, _ in ENGINES)
                             + " (plain SGD always runs)")
    parser.add_argument("--no-malloc-tuning", dest="malloc_tuning", action="store_false",
                        help="keep glibc's default malloc thresholds (default: raysim's, see raysim.allocator)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true",
                        help="time the phases of raysim's per-sample step (bk engine) instead of comparing engines")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time instead of wall time (robust to other load at 1 thread)")
    args = parser.parse_args(argv)
    if args.cpu_time:
        CLOCK[0] = time.process_time
    if args.steps <= 0 or args.batch_size <= 0 or args.warmup < 0:
        parser.error("--steps and --batch-size must be > 0, --warmup >= 0")
    args.engines = args.engines.split(",")
    unknown = sorted(set(args.engines) - {key for key, _, _ in ENGINES})
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)}")
    if args.profile:
        rows = profile(args)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{args.model}{' + LLDM' if args.lldm else ''}, batch {args.batch_size}, "
                  f"{torch.get_num_threads()} threads, {args.steps} timed steps, ms\n\n| phase | min | median |\n|---|---|---|")
            for r in rows:
                print(f"| {r['phase']} | {r['min_ms']:.2f} | {r['median_ms']:.2f} |")
        return
    rows = run(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        model = "paper CNN" if args.model == "cnn" else args.model
        kind, shape, classes = _inputs(args.model)
        inputs = (f"windows of {shape[0]} tokens, vocabulary {classes}" if kind == "tokens"
                  else f"{'x'.join(map(str, shape))} inputs, {classes} classes")
        print(f"{model}{' + LLDM' if args.lldm else ''}, {inputs}, batch {args.batch_size}, {args.steps} timed steps "
              f"after {args.warmup} warm-up, {torch.get_num_threads()} threads, "
              f"malloc tuning {'on' if rows[0]['malloc_tuning'] else 'off'}, B / median step time\n")
        print(_markdown(rows))


if __name__ == "__main__":
    main()
