"""The three clipping modes of docs/privacy.md (`privacy.clipping`), as one function: ``privatize``.

Privacy model shared by all modes: record-level DP for one client's local data set (the unit is
one training example), neighbouring data sets differ by adding or removing one example, and
batches are drawn by Poisson sampling with rate q = B / n_i, so that each call is one
subsampled-Gaussian release for the accountant. The accountant itself lives elsewhere; this
module states, through :func:`accounting_noise_multiplier`, which noise multiplier it must use.

Modes:

- ``per_sample`` (DP-SGD): per-example gradients clipped to C, summed, N(0, σ²C²I) added, the sum
  divided by the *expected* batch size (dividing by the realised size would leak the size).
  Sensitivity of the sum: C, so the accountant uses σ.
- ``batch`` (the paper's eq. 12): the batch-mean gradient is clipped to C and N(0, σ²C²I) is
  added. Replacing (or adding/removing) one example can move the clipped vector from one point
  of the C-ball to another, i.e. by up to 2C, so the accountant must use σ/2.
- ``none``: the plain mean gradient, no privacy.

Noise comes only from the ``torch.Generator`` passed in; no global random state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raysim.config import CLIPPING_MODES
from raysim.noise import GaussianNoise
from raysim.privacy.grad_sample import GradSampleEngine, SparseExamples, layer_param_indices, clip_factors

__all__ = ["CLIPPING_MODES", "PrivateGrad", "privatize", "accounting_noise_multiplier", "total_sensitivity",
           "clip_update"]



@dataclass
class PrivateGrad:
    """One step's gradient estimate and its (non-private) logging statistics.

    Only ``grads`` is a DP output. ``loss_mean``, ``batch_size``, ``num_clipped``,
    ``frac_clipped`` and ``per_example_norms`` are computed from raw private data and are not
    covered by the accountant: log them locally, and a method that uploads them or sets
    thresholds from them opens a side channel that must be reported (docs/privacy.md).
    """

    grads: list[torch.Tensor]
    """Aligned with ``list(model.parameters())``: the gradient estimate to step with."""
    loss_mean: float
    """Mean loss over the realised batch (0.0 for an empty batch)."""
    batch_size: int
    """Realised batch size."""
    num_clipped: int
    """per_sample: examples whose norm exceeded C; batch: the batch size if the mean gradient was
    clipped, else 0; none: 0."""
    frac_clipped: float
    per_example_norms: torch.Tensor | None = None
    """per_sample: (B,) pre-clipping per-example gradient norms (raw private data); None otherwise."""


def accounting_noise_multiplier(mode: str, noise_multiplier: float) -> float:
    """Noise multiplier the accountant must use for one step of ``mode`` at noise σ.

    ``per_sample``: σ (sensitivity C under add/remove). ``batch``: σ/2, because the clipped batch
    mean can move by 2C when one example changes. ``none``: 0.0 (no guarantee).
    """
    _check_mode(mode)
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if mode == "per_sample":
        return float(noise_multiplier)
    if mode == "batch":
        return float(noise_multiplier) / 2.0
    return 0.0


def total_sensitivity(clip_norm: float | Sequence[float], per_layer: bool = False) -> float:
    """The l2 bound C of one example's clipped contribution: C, or sqrt(Σ C_k²) per layer."""
    if per_layer:
        return math.sqrt(sum(float(c) ** 2 for c in clip_norm))
    return float(clip_norm)


def _check_mode(mode: str) -> None:
    if mode not in CLIPPING_MODES:
        raise ValueError(f"privacy.clipping must be one of {CLIPPING_MODES}, got {mode!r}")


def _gaussian_like(tensors: list[torch.Tensor], std: float, noise: GaussianNoise | None) -> list[torch.Tensor]:
    if std == 0.0:
        return [torch.zeros_like(t) for t in tensors]
    if noise is None:
        raise ValueError("noise needs an explicit key (raysim never draws DP noise from the global RNG); "
                         "pass a raysim.noise.GaussianNoise")
    return noise.like(tensors, std)


def _mean_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    params = list(model.parameters())
    if x.shape[0] == 0:
        return [torch.zeros_like(p) for p in params], 0.0
    loss = F.cross_entropy(model(x), y, reduction="mean")
    trainable = [p for p in params if p.requires_grad]
    got = iter(torch.autograd.grad(loss, trainable, allow_unused=True))
    grads = []
    for p in params:
        g = next(got) if p.requires_grad else None
        grads.append(torch.zeros_like(p) if g is None else g.detach())
    return grads, float(loss.detach())


def _layer_norms(grads: list[torch.Tensor], groups: list[list[int]]) -> torch.Tensor:
    """(K,) l2 norm of each parametrised layer's part of ``grads``."""
    sq = [torch.stack([grads[j].pow(2).sum() for j in ids]).sum() for ids in groups]
    return torch.stack(sq).sqrt()


def privatize(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, mode: str,
              clip_norm: float | Sequence[float], noise_multiplier: float, expected_batch_size: int,
              noise: GaussianNoise | None, engine: GradSampleEngine,
              per_layer: bool = False, canaries: SparseExamples | None = None) -> PrivateGrad:
    """Gradient estimate for one local step under clipping ``mode`` (see the module docstring).

    Privacy assumptions: ``x, y`` is a Poisson-sampled batch (rate q = expected_batch_size / n)
    of one client's records; the guarantee is record-level under add/remove of one example, with
    noise multiplier :func:`accounting_noise_multiplier` (mode, σ) for the accountant. Noise is
    added even to an empty batch, as the mechanism requires. ``clip_norm`` is C, or the per-layer
    thresholds C_k (one per parametrised layer) with ``per_layer=True``; the noise standard
    deviation is σ·C with C = :func:`total_sensitivity`. The model's ``.grad`` fields are not
    touched; the caller steps with ``PrivateGrad.grads``.

    ``canaries`` (the privacy audit only, ``raysim.audit``): k extra examples of this batch. In
    ``per_sample`` mode they go through the engine's per-example path with the batch (norms, clip
    factors, clipped sum; :class:`~raysim.privacy.grad_sample.LayerCanaries` through the very code of
    the batch's examples), so a clipping bug lets them through; in ``batch`` mode
    (:class:`~raysim.privacy.grad_sample.SparseExamples` only) they join the batch mean before it is
    clipped.
    """
    _check_mode(mode)
    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    batch = int(x.shape[0])

    if mode == "per_sample":
        if expected_batch_size <= 0:
            raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
        # (noise + Σ clipped) / B, computed as noise·(σC/B) + Σ (c_i/B)·g_i: the noise is drawn
        # first and the engine accumulates into it, one multi-MB pass per parameter fewer.
        scale = 1.0 / expected_batch_size
        std = noise_multiplier * total_sensitivity(clip_norm, per_layer)
        drawn = _gaussian_like(list(model.parameters()), std * scale, noise)
        res = engine.clipped_sum(model, x, y, clip_norm, per_layer=per_layer, scale=scale, out=drawn, extra=canaries)
        grads = res.grads
        return PrivateGrad(grads=grads, loss_mean=res.loss_sum / batch if batch else 0.0, batch_size=batch,
                           num_clipped=res.num_clipped, frac_clipped=res.num_clipped / batch if batch else 0.0,
                           per_example_norms=res.per_example_norms)

    grads, loss_mean = _mean_gradient(model, x, y)
    groups = layer_param_indices(model) if mode == "batch" or canaries else []   # a walk of the modules
    if canaries:
        total = batch + len(canaries)
        summed = [g * batch for g in grads]
        canaries.add_to(summed, torch.ones(len(canaries), len(groups), dtype=canaries.values.dtype), groups)
        grads = [g / total for g in summed]
    if mode == "none":
        return PrivateGrad(grads=grads, loss_mean=loss_mean, batch_size=batch, num_clipped=0, frac_clipped=0.0)
    with torch.no_grad():
        norms = _layer_norms(grads, groups)
        factors, clipped = clip_factors(norms.unsqueeze(0), clip_norm, per_layer)
        layer_of = {j: k for k, ids in enumerate(groups) for j in ids}
        std = noise_multiplier * total_sensitivity(clip_norm, per_layer)
        drawn = _gaussian_like(grads, std, noise)
        out = [n.add_(g * factors[0, layer_of[j]]) if j in layer_of else n.add_(g)
               for j, (g, n) in enumerate(zip(grads, drawn))]
    num_clipped = batch if clipped else 0
    return PrivateGrad(grads=out, loss_mean=loss_mean, batch_size=batch, num_clipped=num_clipped,
                       frac_clipped=float(bool(clipped)) if batch else 0.0)


def clip_update(delta: torch.Tensor, clip_norm: float) -> tuple[torch.Tensor, float]:
    """``privacy.unit=client``: a client's whole update scaled to l2 norm at most C (flat over all
    parameters, norm in float64), and its norm before clipping (private: logged, never uploaded)."""
    norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64))
    if norm <= clip_norm:
        return delta, norm
    return delta * (clip_norm / norm), norm
