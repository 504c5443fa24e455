"""The Gaussian noise of every DP release, drawn in blocks that several threads can draw at once.

A release's noise over some tensors (taken in order, each flattened) is drawn in blocks of
:data:`BLOCK` consecutive elements, block b from its own generator, seeded with the b-th 64-bit word
of the key's seed state (:func:`raysim.rng.torch_generators`). Block 0's generator is the key's
:func:`~raysim.rng.torch_generator`, so noise of at most one block is that generator's draw. The bits
depend only on the key and the tensors' shapes, never on the thread count or the machine.

torch's CPU generator draws one element after another, so one generator keeps one core busy while
the others wait: with T torch threads (``runtime.torch_threads``) the blocks are cut into T
contiguous runs of about equal size, drawn on T threads at once. libgomp's threads spin for a while
after each parallel region before they sleep, and while they spin they hold the cores those threads
need: :func:`raysim.allocator.spin_less` shortens the spin in the processes raysim starts
(docs/performance.md).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import torch

from raysim.rng import GLOBAL, torch_generators

__all__ = ["BLOCK", "GaussianNoise"]

#: Elements per generator (2 MB of float32), so that seeding the generators (a few µs each) costs
#: nothing beside the draw (about 1.8 ms a block on one core here).
BLOCK = 2**19

_pool: tuple[int, int, ThreadPoolExecutor] | None = None     # (pid, workers, pool)


def _workers(count: int) -> ThreadPoolExecutor:
    """A pool of ``count`` threads for this process (a forked child makes its own)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != count:
        if _pool is not None and _pool[0] == os.getpid():
            _pool[2].shutdown(wait=False)
        _pool = (os.getpid(), count, ThreadPoolExecutor(count, thread_name_prefix="raysim-noise"))
    return _pool[2]


def _runs(sizes: Sequence[int], parts: int) -> list[range]:
    """``range(len(sizes))`` cut into at most ``parts`` contiguous runs of about equal total size."""
    ends = list(itertools.accumulate(sizes))
    cuts = {min(range(len(sizes)), key=lambda i: abs(ends[i] * parts - ends[-1] * k)) + 1 for k in range(1, parts)}
    edges = [0, *sorted(c for c in cuts if c < len(sizes)), len(sizes)]
    return [range(lo, hi) for lo, hi in zip(edges, edges[1:])]


class StreamedNoise:
    """The correlated noise of one release: the next step of ``stream`` (a mechanism's noise state, such as
    BandMF's ``(C⁻¹ z)_t``, :class:`raysim.privacy.mechanisms.bandmf.BandMFNoise`) from the release's own
    i.i.d. draw z_t (``draw``'s noise shaped like the tensors, at std 1), times ``std``. With the identity
    strategy it is ``draw``'s noise (to float32 rounding)."""

    def __init__(self, draw: "GaussianNoise", stream: Any) -> None:
        self.draw, self.stream = draw, stream

    def like(self, tensors: Sequence[torch.Tensor], std: float) -> list[torch.Tensor]:
        z = torch.cat([d.reshape(-1).cpu() for d in self.draw.like(tensors, 1.0)])   # the independent draw's bits
        flat = (self.stream.step(z) * std).to(torch.float32)
        out, start = [], 0
        for t in tensors:
            piece = torch.empty(t.shape, dtype=t.dtype, device=self.draw.device)
            piece.copy_(flat[start:start + t.numel()].view(t.shape))
            out.append(piece)
            start += t.numel()
        return out


class GaussianNoise:
    """N(0, std²) noise of one release, keyed ``(seed, purpose, server_round, client_id, *extra)``."""

    def __init__(self, seed: int, purpose: str, server_round: int = 0, client_id: int = GLOBAL, *extra: int,
                 device: str | torch.device = "cpu") -> None:
        self.key = (seed, purpose, server_round, client_id, *extra)
        self.device = torch.device(device)

    def like(self, tensors: Sequence[torch.Tensor], std: float) -> list[torch.Tensor]:
        """New tensors shaped like ``tensors``, filled with the noise (zeros when ``std`` is 0)."""
        return self._fill([torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in tensors], std)

    def vector(self, size: int, std: float) -> torch.Tensor:
        """A float32 vector of ``size`` elements of the noise."""
        return self._fill([torch.empty(size, dtype=torch.float32, device=self.device)], std)[0]

    def _fill(self, out: list[torch.Tensor], std: float) -> list[torch.Tensor]:
        if std == 0.0:
            return [o.zero_() for o in out]
        blocks: list[list[torch.Tensor]] = []        # block b: its pieces of the flattened tensors
        sizes: list[int] = []
        for f in (o.view(-1) for o in out):
            start = 0
            while start < f.numel():
                if not sizes or sizes[-1] == BLOCK:
                    blocks.append([])
                    sizes.append(0)
                take = min(BLOCK - sizes[-1], f.numel() - start)
                blocks[-1].append(f[start:start + take])
                sizes[-1] += take
                start += take
        if not blocks:
            return out
        gens = torch_generators(len(blocks), *self.key, device=self.device)

        def draw(run: range) -> None:
            for b in run:
                for piece in blocks[b]:
                    piece.normal_(0.0, std, generator=gens[b])

        threads = torch.get_num_threads() if self.device.type == "cpu" else 1
        runs = _runs(sizes, min(threads, len(blocks)))
        if len(runs) == 1:
            draw(runs[0])
            return out
        pending = [_workers(len(runs) - 1).submit(draw, run) for run in runs[1:]]
        draw(runs[0])
        for p in pending:
            p.result()
        return out
