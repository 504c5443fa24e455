"""Small measurements behind the README's performance notes, one sub-command each.

    python experiments/bench/probes.py noise           # Gaussian draws for the CNN's 2.16 M parameters
    python experiments/bench/probes.py noise-in-step   # bk step: serial draw, 2-thread chunked, background
    python experiments/bench/probes.py spin            # 2-thread chunked draw right after a parallel op
    python experiments/bench/probes.py actor-start     # 10 Ray actors, bare vs importing torch
    python experiments/bench/probes.py transfer        # 5 model deltas back from an actor: tensors vs arrays
    python experiments/bench/probes.py client-cost     # fit of a client's round time on the digits quickstart

Times are medians over repeated calls in this process (milliseconds unless marked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import torch  # noqa: E402

CNN_PARAMS = 2_156_490
CHUNK = 1 << 18


def _median_ms(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _chunked_normal(n: int, generator: torch.Generator, pool: ThreadPoolExecutor) -> torch.Tensor:
    """N(0, 1) in fixed chunks, each from its own seed drawn from ``generator`` (the same bits at any
    thread count), filled on the pool's threads."""
    out = torch.empty(n)
    chunks = out.split(CHUNK)
    seeds = torch.randint(0, 2**62, (len(chunks),), generator=generator).tolist()

    def fill(chunk: torch.Tensor, seed: int) -> None:
        chunk.normal_(generator=torch.Generator().manual_seed(seed))
    list(pool.map(fill, chunks, seeds))
    return out


def noise(args) -> None:
    n = CNN_PARAMS
    buf = torch.empty(n)
    gen = torch.Generator().manual_seed(0)
    rng = np.random.Generator(np.random.PCG64(0))
    bits = np.random.PCG64(0)

    def box_muller_numpy() -> np.ndarray:
        raw = bits.random_raw(n // 2)
        u1 = ((raw & 0xFFFFFFFF).astype(np.float32) + np.float32(1.0)) * np.float32(2.0**-32)
        theta = np.float32(2 * np.pi) * (raw >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
        r = np.sqrt(np.float32(-2.0) * np.log(u1))
        return np.concatenate([r * np.cos(theta), r * np.sin(theta)])

    with ThreadPoolExecutor(2) as pool:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            rows = {
                "torch normal_ (serial Mersenne Twister)": lambda: buf.normal_(generator=gen),
                "torch uniform_": lambda: buf.uniform_(generator=gen),
                "numpy PCG64 standard_normal float32": lambda: rng.standard_normal(n, dtype=np.float32),
                "numpy Box-Muller from PCG64 bits": box_muller_numpy,
                "chunked normal_ on 2 Python threads": lambda: _chunked_normal(n, gen, pool),
            }
            print(f"\n{n:,} draws, torch threads = {threads}\n\n| generator | ms |\n|---|---|")
            for name, fn in rows.items():
                print(f"| {name} | {_median_ms(fn):.2f} |")


def noise_in_step(args) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import dp_step
    from raysim.privacy import clipping

    serial_draw = clipping._gaussian_like
    pool = ThreadPoolExecutor(2)
    spent: dict[str, list[float]] = {"serial draw": [], "chunked draw": [], "background draw (wait)": []}

    def chunked(grads, std, generator):
        flat = _chunked_normal(sum(g.numel() for g in grads), generator, pool).mul_(std)
        return [part.view(g.shape) for part, g in zip(flat.split([g.numel() for g in grads]), grads)]

    ahead = ThreadPoolExecutor(1)
    pending: list = []

    def background(grads, std, generator):
        """The next step's noise is drawn on another thread while this step computes (its own
        generator, so the bits differ from the serial draw's; this measures time only)."""
        shapes = [g.shape for g in grads]
        draw = lambda: [torch.randn(shape, generator=generator) for shape in shapes]  # noqa: E731
        noise = pending.pop().result() if pending else draw()
        pending.append(ahead.submit(draw))
        return [n.mul_(std) for n in noise]

    def timed(name, draw):
        def call(*a):
            start = time.perf_counter()
            out = draw(*a)
            spent[name].append(time.perf_counter() - start)
            return out
        return call

    def engine(draw):
        base = dp_step._raysim("per_sample", "bk")

        def factory(model, a):
            step = base(model, a)

            def run(x, y):
                clipping._gaussian_like = draw
                try:
                    step(x, y)
                finally:
                    clipping._gaussian_like = serial_draw
            return run
        return factory

    dp_step.ENGINES = [e for e in dp_step.ENGINES if e[0] == "plain"] + [
        ("bk", "raysim per-sample (bk), serial draw", engine(timed("serial draw", serial_draw))),
        ("bk-chunked", "raysim per-sample (bk), chunked 2-thread draw", engine(timed("chunked draw", chunked))),
        ("bk-background", "raysim per-sample (bk), next step's noise drawn on a background thread",
         engine(timed("background draw (wait)", background)))]
    dp_step.main(["--threads", "2", "--steps", str(args.steps), "--engines", "bk,bk-chunked,bk-background"])
    print("\n| noise draw inside the step | median ms |\n|---|---|")
    for name, values in spent.items():
        print(f"| {name} | {statistics.median(values) * 1e3:.2f} |")
    print(f"\nGOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '(unset)')}")


def spin(args) -> None:
    """How long libgomp's worker keeps the second core busy after a parallel region: a 2-thread
    chunked draw right after a parallel op, and after sleeping a while first."""
    torch.set_num_threads(2)
    pool = ThreadPoolExecutor(2)
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(4_000_000)
    print("| before the 2-thread chunked draw | median ms |\n|---|---|")
    for label, parallel_op, pause in (("20 ms sleep, no parallel op", False, 0.02),
                                      ("a parallel op", True, 0.0),
                                      ("a parallel op, then 2 ms sleep", True, 0.002),
                                      ("a parallel op, then 5 ms sleep", True, 0.005),
                                      ("a parallel op, then 10 ms sleep", True, 0.01)):
        times = []
        for _ in range(30):
            if parallel_op:
                big.mul_(1.0001)
            if pause:
                time.sleep(pause)
            start = time.perf_counter()
            _chunked_normal(CNN_PARAMS, gen, pool)
            times.append(time.perf_counter() - start)
        print(f"| {label} | {statistics.median(times) * 1e3:.2f} |")


def actor_start(args) -> None:
    import ray
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    time.sleep(3)   # let Ray's own processes settle

    @ray.remote(num_cpus=0.01)
    class Bare:
        def ready(self) -> bool:
            return True

    @ray.remote(num_cpus=0.01)
    class WithTorch:
        def __init__(self) -> None:
            import torch  # noqa: F401  (the import is what is measured)

        def ready(self) -> bool:
            return True

    print(f"\n| {args.actors} actors | seconds until all ready |\n|---|---|")
    for name, cls in (("bare", Bare), ("importing torch", WithTorch)):
        start = time.perf_counter()
        actors = [cls.remote() for _ in range(args.actors)]
        ray.get([a.ready.remote() for a in actors])
        print(f"| {name} | {time.perf_counter() - start:.2f} |")
        for a in actors:
            ray.kill(a)
        time.sleep(3)
    ray.shutdown()


def transfer(args) -> None:
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    size = args.delta_size

    @ray.remote
    class Sender:
        def tensors(self) -> list:
            return [torch.randn(size) for _ in range(5)]

        def arrays(self) -> list:
            return [torch.randn(size).numpy() for _ in range(5)]

    sender = Sender.remote()
    ray.get(sender.tensors.remote())
    print(f"\n| 5 deltas of {size:,} float32 from an actor | ms |\n|---|---|")
    print(f"| as torch tensors | {_median_ms(lambda: ray.get(sender.tensors.remote())):.2f} |")
    print(f"| as NumPy arrays, made writable tensors | "
          f"{_median_ms(lambda: [torch.from_numpy(a.copy()) for a in ray.get(sender.arrays.remote())]):.2f} |")
    ray.shutdown()


def client_cost(args) -> None:
    from raysim.config import config_from_dict
    from raysim.data import load_dataset
    from raysim.runtime.serial import SerialExecutor
    from raysim.simulation import Simulation

    cfg = config_from_dict({"method": "fedavg", "rounds": args.rounds, "num_clients": 10, "local_epochs": 1,
                            "batch_size": 64, "lr": 0.01, "runtime": {"executor": "serial"},
                            "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.3}})
    sim = Simulation(cfg, load_dataset("digits", "train", None), load_dataset("digits", "test", None), SerialExecutor())
    rows = [row for t in range(1, args.rounds + 1) for row in sim.round(t).client_rows if t > 2]
    n = np.array([r["num_samples"] for r in rows], dtype=np.float64)
    seconds = np.array([r["client_seconds"] for r in rows])
    slope, intercept = np.linalg.lstsq(np.stack([n, np.ones_like(n)], 1), seconds, rcond=None)[0]
    print(f"client seconds ≈ {slope * 1e3:.4f} ms × n_i + {intercept * 1e3:.3f} ms "
          f"(fixed cost = {intercept / slope:.1f} examples; {len(rows)} client rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="probe", required=True)
    sub.add_parser("noise")
    sub.add_parser("spin")
    step = sub.add_parser("noise-in-step")
    step.add_argument("--steps", type=int, default=40)
    start = sub.add_parser("actor-start")
    start.add_argument("--actors", type=int, default=10)
    move = sub.add_parser("transfer")
    move.add_argument("--delta-size", type=int, default=188_810, help="digits quickstart model size")
    cost = sub.add_parser("client-cost")
    cost.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    {"noise": noise, "noise-in-step": noise_in_step, "spin": spin, "actor-start": actor_start, "transfer": transfer,
     "client-cost": client_cost}[args.probe](args)


if __name__ == "__main__":
    main()
