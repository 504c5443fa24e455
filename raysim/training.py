"""The one local training loop; every method runs it, changing only its hooks.

Privacy assumptions (docs/privacy.md): record-level DP for one client's local data; in the DP modes
each step's batch is drawn by Poisson sampling with rate q = B / n_i (independently per
example), so the subsampled-Gaussian accountant applies (under a correlated ``privacy.mechanism``, from
one of the client's cyclic groups of examples: :class:`CorrelatedSteps`); each step makes
``hooks.releases_per_step`` Gaussian releases on that batch. Everything the hooks add after
``privatize`` depends only on DP outputs and public values (post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from raysim.algorithms.base import ClientHooks
from raysim.noise import GaussianNoise, StreamedNoise
from raysim.privacy.clipping import privatize
from raysim.privacy.grad_sample import GradSampleEngine, LayerCanaries, SparseExamples
from raysim.rng import np_generator


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """⌈n_i / B⌉ local steps per epoch (T·E·⌈n_i/B⌉ steps in all over T rounds)."""
    return max(1, math.ceil(num_samples / batch_size))


def sample_rate(num_samples: int, batch_size: int) -> float:
    """Poisson sampling rate q = B / n_i (1 when the client holds fewer than B examples)."""
    return min(1.0, batch_size / num_samples)


@dataclass
class CorrelatedSteps:
    """A client's DP-SGD steps under a correlated mechanism (``privacy.unit=example``, ``privacy.mechanism=
    bandmf``): its examples cut into ``len(groups)`` cyclic groups, and the s-th step of its training over the
    run (``offset`` steps came before this round) draws each example of group s mod b with probability
    ``rate``; each step's noise is the next step of ``stream``. An example joins at most one step in b, the
    separation the strategy's sensitivity assumes."""

    groups: list[np.ndarray]
    rate: float
    stream: Any
    offset: int

    @staticmethod
    def partition(num_samples: int, bands: int, seed: int, client_id: int) -> list[np.ndarray]:
        """A balanced random partition of the client's examples into ``bands`` groups, fixed for the run
        (keyed by the seed and the client)."""
        order = np_generator(seed, "step-groups", client_id).permutation(num_samples)
        return [np.sort(order[g::bands]) for g in range(bands)]


@dataclass(frozen=True)
class LocalStats:
    num_steps: int
    train_loss: float
    frac_clipped: float


class LocalSGD:
    """SGD with heavy-ball momentum, the update of ``torch.optim.SGD(params, lr, momentum)``: the same
    bits on CPU (its single-tensor path: the buffer is the first gradient, then b ← μ·b + g; p ← p − lr·b).

    Written out because ``torch.optim``'s constructor imports ``torch._dynamo`` on its first call:
    1.5–1.8 s in a fresh process on the 2-core VM (docs/performance.md), paid by every new client actor's
    first client and so by round 1. ``tests/unit/core/test_local_train.py`` checks the bits against torch.optim.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float = 0.0) -> None:
        self.params, self.lr, self.momentum = params, float(lr), float(momentum)
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.momentum != 0.0:
                if self.buffers[i] is None:
                    self.buffers[i] = g.detach().clone()
                else:
                    self.buffers[i].mul_(self.momentum).add_(g)
                g = self.buffers[i]
            p.add_(g, alpha=-self.lr)


#: Examples per engine call in :func:`example_norm_pass` (at least the training batch size).
NORM_PASS_CHUNK = 256


def example_norm_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, engine: GradSampleEngine,
                      batch_size: int) -> np.ndarray:
    """Pre-clipping per-example gradient norms of every example of (x, y) at the model's current weights.

    The pre-round pass of the clipping statistics (ADPC's histogram, the adaptive-quantile bit): it runs
    before local training, at the round's starting model, changes no weight and draws no randomness,
    so it is independent of the round's DP-SGD sampling and noise. Raw private data: only a noised
    release of it may leave the client.
    """
    chunk = max(batch_size, NORM_PASS_CHUNK)
    out = [engine.example_norms(model, x[i:i + chunk], y[i:i + chunk]) for i in range(0, len(y), chunk)]
    return torch.cat(out).detach().cpu().double().numpy() if out else np.zeros(0)


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, hooks: ClientHooks, *, clipping: str,
                engine: GradSampleEngine, per_layer: bool, seed: int, client_id: int,
                canaries: Callable[[int], LayerCanaries | SparseExamples | None] | None = None,
                correlated: CorrelatedSteps | None = None) -> LocalStats:
    """Run E local epochs of (DP-)SGD on (x, y) in place on ``model``.

    Random streams: batches from ``(seed, "batches", round, client)``, noise from
    ``(seed, "dp-noise", round, client, step, release)`` (drawn in blocks, :mod:`raysim.noise`) — independent
    of where this runs and of the thread count. ``correlated``: the batches come from the client's cyclic
    groups and the noise from the mechanism's stream (:class:`CorrelatedSteps`).
    ``canaries(step)`` (the privacy audit only) gives that step's extra examples
    (:class:`~raysim.privacy.grad_sample.LayerCanaries` or
    :class:`~raysim.privacy.grad_sample.SparseExamples`), clipped and noised with the batch by :func:`privatize`.
    """
    cfg, task = hooks.cfg, hooks.task
    n, batch_size = len(y), cfg.batch_size
    params = [p for p in model.parameters()]
    optimizer = LocalSGD(params, lr=cfg.lr * task.lr_scale, momentum=cfg.momentum)
    batch_rng = np_generator(seed, "batches", task.server_round, client_id)
    q = sample_rate(n, batch_size)
    expected_batch = q * n if correlated is None else correlated.rate * n / len(correlated.groups)
    per_epoch = steps_per_epoch(n, batch_size)
    losses, clipped, seen, step = [], 0, 0, 0
    for _epoch in range(cfg.local_epochs):
        order = batch_rng.permutation(n) if clipping == "none" else None
        for k in range(per_epoch):
            if correlated is not None:   # Poisson sampling within the step's cyclic group
                members = correlated.groups[(correlated.offset + step) % len(correlated.groups)]
                idx = members[batch_rng.random(len(members)) < correlated.rate]
            elif order is None:
                idx = np.flatnonzero(batch_rng.random(n) < q)      # Poisson sampling
            else:
                idx = np.sort(order[k * batch_size:(k + 1) * batch_size])
            xb, yb = x[idx], y[idx]
            release = iter(range(hooks.releases_per_step))

            def compute(xb=xb, yb=yb, step=step):
                noise: GaussianNoise | StreamedNoise = GaussianNoise(
                    seed, "dp-noise", task.server_round, client_id, step, next(release), device=x.device)
                if correlated is not None:
                    noise = StreamedNoise(noise, correlated.stream)
                return privatize(model, xb, yb, mode=clipping, clip_norm=task.clip_norm,
                                 noise_multiplier=task.noise_multiplier, expected_batch_size=expected_batch,
                                 noise=noise, engine=engine, per_layer=per_layer,
                                 canaries=canaries(step) if canaries is not None else None)

            private = hooks.private_gradient(params, compute)
            extra = hooks.extra_gradient(params)
            for i, p in enumerate(params):
                g = private.grads[i]
                p.grad = g if extra is None else g + extra[i]
            optimizer.step()
            if len(idx):
                losses.append((private.loss_mean, len(idx)))
            clipped += private.num_clipped
            seen += private.batch_size
            step += 1
    total = sum(c for _, c in losses)
    train_loss = sum(loss * c for loss, c in losses) / total if total else float("nan")
    return LocalStats(step, float(train_loss), clipped / seen if seen else 0.0)
