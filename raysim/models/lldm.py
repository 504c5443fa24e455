"""LLDM gradient sparsification (reconstructed; docs/methods.md, "FedDimDP").

Identity in the forward pass; in the backward pass the gradient reaching the reduced feature
map F̃ is sparsified per example, keeping the ⌈κ·d⌉ entries of largest magnitude (d = the
number of entries of one example's feature map) and zeroing the rest. Being a custom autograd
function between layers, it changes the backprops that hook-based per-sample engines record
at the layers below it, so they see the sparsified gradient.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class _TopKGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, keep_fraction: float) -> torch.Tensor:  # type: ignore[override]
        ctx.keep_fraction = keep_fraction
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return sparsify_per_example(grad, ctx.keep_fraction), None


def sparsify_per_example(grad: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Keep the top ⌈κ·d⌉ entries by magnitude of each example (dim 0), zero the rest."""
    batch = grad.shape[0]
    flat = grad.reshape(batch, -1)
    d = flat.shape[1]
    k = min(d, max(1, math.ceil(keep_fraction * d)))
    if k == d:
        return grad
    idx = flat.abs().topk(k, dim=1, sorted=False).indices
    out = torch.zeros_like(flat)
    out.scatter_(1, idx, flat.gather(1, idx))
    return out.view_as(grad)


class TopKGradSparsifier(nn.Module):
    """Module wrapper around the top-k gradient sparsifier; ``keep_fraction`` is κ."""

    def __init__(self, keep_fraction: float) -> None:
        super().__init__()
        if not 0.0 < keep_fraction <= 1.0:
            raise ValueError(f"lldm.keep_fraction must be in (0, 1], got {keep_fraction}")
        self.keep_fraction = float(keep_fraction)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _TopKGrad.apply(x, self.keep_fraction)

    def extra_repr(self) -> str:
        return f"keep_fraction={self.keep_fraction}"


class LLDMBlock(nn.Module):
    """FedDimDP's LLDM block for a backbone's last feature map: 1x1 conv ``channels → ⌈r·channels⌉``
    (no bias), ReLU, then the top-k gradient sparsifier (skipped when ``keep_fraction`` is None)."""

    def __init__(self, channels: int, reduction: float, keep_fraction: float | None) -> None:
        super().__init__()
        if not 0.0 < reduction <= 1.0:
            raise ValueError(f"lldm.reduction must be in (0, 1], got {reduction}")
        self.out_channels = math.ceil(reduction * channels)
        self.reduce = nn.Conv2d(channels, self.out_channels, kernel_size=1, bias=False)
        self.sparsify = None if keep_fraction is None else TopKGradSparsifier(keep_fraction)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.reduce(x))
        return x if self.sparsify is None else self.sparsify(x)
