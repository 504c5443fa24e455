"""Per-example gradient norms and sums of per-example clipped gradients.

An engine answers one question for a batch: given per-example losses (cross-entropy), what is
each example's gradient norm, and what is ``Σ_i c_i ∇ℓ_i`` with the DP-SGD clip factors
``c_i = min(1, C / (‖∇ℓ_i‖ + 1e-6))``? It adds no noise and does not divide: that belongs to
``raysim.privacy.clipping``.

``bk`` (default) is the book-keeping engine (Bu et al. 2022; ghost norm of Goodfellow 2015 and
Li et al. 2021). One forward pass records each layer's input activation ``a``; one backward pass
(``torch.autograd.grad`` of the summed loss with respect to the layer *outputs*, so autograd never
computes weight gradients) gives the output gradients ``g``. For a layer with per-example grad
``G_i = g_iᵀ a_i`` (``g_i``: L × D_out, ``a_i``: L × D_in, L = 1 for a Linear layer, the number
of output positions for a conv) the squared norm is either ``‖a_i‖²‖g_i‖²`` (L = 1), the ghost
norm ``⟨a_i a_iᵀ, g_i g_iᵀ⟩`` (memory B·L²), or read off the materialised ``G_i`` (memory
B·D_out·D_in, for a conv computed as the weight gradient of a conv with groups=B), whichever
is smaller. The clipped sum is then ``Σ_i c_i G_i``: one contraction. Custom autograd functions
between layers (LLDM's top-k gradient sparsifier) are handled because ``g`` is what the real
backward pass delivers at each layer output. Refused with a ValueError: parametrised modules
other than Conv2d (groups=1) and Linear, tied weights, layer outputs modified in place.

``vmap`` is the reference engine: ``torch.func.vmap(grad(·))`` over examples, any model whose
layers torch.func can transform (not LLDM's sparsifier, an old-style autograd.Function).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ClippedGrads", "GradSampleEngine", "BookKeepingEngine", "VmapEngine", "ENGINES",
    "register_engine", "make_engine", "parametrised_layers", "layer_param_indices", "layer_slices", "clip_factors",
    "CLIP_EPS",
]

#: Added to a norm before dividing, as in Opacus; an example with norm exactly C is scaled by ≈1.
CLIP_EPS = 1e-6


@dataclass
class ClippedGrads:
    """Result of one engine call; all tensors are detached."""

    grads: list[torch.Tensor]
    """Aligned with ``list(model.parameters())``: Σ over the batch of clipped per-example grads."""
    per_example_norms: torch.Tensor
    """(B,) unclipped total (global l2) per-example gradient norms."""
    num_clipped: int
    """Examples with norm > C (per-layer mode: with any layer over its threshold)."""
    loss_sum: float
    """Sum of per-example losses, for logging."""
    per_layer_norms: torch.Tensor
    """(B, K) unclipped per-example norms of each parametrised layer (weight and bias together)."""


class GradSampleEngine(Protocol):
    name: str

    def clipped_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    clip_norm: float | Sequence[float], *, per_layer: bool = False) -> ClippedGrads:
        """Per-example norms and the sum of per-example clipped gradients of the summed CE loss."""
        ...


ENGINES: dict[str, type] = {}


def register_engine(name: str) -> Callable[[type], type]:
    """Class decorator adding an engine to ``ENGINES``; refuses a name that is already taken."""
    def decorator(cls: type) -> type:
        if name in ENGINES:
            raise ValueError(f"grad-sample engine {name!r} is already registered ({ENGINES[name].__name__})")
        cls.name = name
        ENGINES[name] = cls
        return cls
    return decorator


def make_engine(name: str = "bk") -> GradSampleEngine:
    """Instantiate a registered engine by name."""
    if name not in ENGINES:
        raise ValueError(f"unknown grad-sample engine {name!r}; known: {sorted(ENGINES)}")
    return ENGINES[name]()


def _owned_params(model: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    out, seen = [], set()
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        if own:
            out.append((module, own))
            seen.update(id(p) for p in own)
    return out


def parametrised_layers(model: nn.Module) -> list[nn.Module]:
    """Modules that own parameters directly, in ``model.modules()`` order (the layer order of
    per-layer clip thresholds). Parameters shared between two modules count for the first."""
    return [module for module, _ in _owned_params(model)]


def layer_slices(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """[start, end) of each parametrised layer's parameters in the flat ``parameters_to_vector`` layout."""
    offsets = [0]
    for p in model.parameters():
        offsets.append(offsets[-1] + p.numel())
    return tuple((offsets[min(ids)], offsets[max(ids) + 1]) for ids in layer_param_indices(model))


def layer_param_indices(model: nn.Module) -> list[list[int]]:
    """For each parametrised layer, the indices into ``list(model.parameters())`` it owns."""
    index = {id(p): j for j, p in enumerate(model.parameters())}
    return [[index[id(p)] for p in own] for _, own in _owned_params(model)]


def _thresholds(clip_norm: float | Sequence[float], per_layer: bool, num_layers: int) -> list[float]:
    if per_layer:
        if isinstance(clip_norm, numbers.Real):
            raise ValueError("per_layer=True needs one clip threshold per parametrised layer, got a scalar")
        values = [float(c) for c in clip_norm]
        if len(values) != num_layers:
            raise ValueError(f"per-layer clipping needs {num_layers} thresholds (one per parametrised "
                             f"layer), got {len(values)}")
    else:
        if not isinstance(clip_norm, numbers.Real):
            raise ValueError("a sequence of clip thresholds needs per_layer=True")
        values = [float(clip_norm)]
    if not all(math.isfinite(c) and c > 0 for c in values):
        raise ValueError(f"clip thresholds must be finite and > 0, got {values}")
    return values


def clip_factors(per_layer_norms: torch.Tensor, clip_norm: float | Sequence[float],
                 per_layer: bool = False) -> tuple[torch.Tensor, int]:
    """Clip factors (B, K) and the number of clipped examples, from per-layer norms (B, K).

    Flat clipping scales every layer of example i by ``min(1, C / (‖g_i‖ + 1e-6))`` with ‖g_i‖
    the l2 norm of its per-layer norms; per-layer clipping scales layer k by
    ``min(1, C_k / (‖g_{i,k}‖ + 1e-6))``.
    """
    num_layers = per_layer_norms.shape[1]
    thresholds = _thresholds(clip_norm, per_layer, num_layers)
    if per_layer:
        c = per_layer_norms.new_tensor(thresholds)
        factors = (c / (per_layer_norms + CLIP_EPS)).clamp(max=1.0)
        clipped = (per_layer_norms > c).any(dim=1)
    else:
        total = per_layer_norms.pow(2).sum(dim=1).sqrt()
        factors = (thresholds[0] / (total + CLIP_EPS)).clamp(max=1.0).unsqueeze(1).expand_as(per_layer_norms)
        clipped = total > thresholds[0]
    return factors, int(clipped.sum())


def _empty_result(model: nn.Module, x: torch.Tensor, clip_norm, per_layer: bool) -> ClippedGrads:
    num_layers = len(parametrised_layers(model))
    _thresholds(clip_norm, per_layer, num_layers)
    params = list(model.parameters())
    dtype = params[0].dtype if params else x.dtype
    return ClippedGrads(grads=[torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for p in params],
                        per_example_norms=torch.zeros(0, dtype=dtype, device=x.device),
                        num_clipped=0, loss_sum=0.0,
                        per_layer_norms=torch.zeros(0, num_layers, dtype=dtype, device=x.device))


def _check_supported(layers: list[nn.Module], names: dict[int, str]) -> None:
    seen: set[int] = set()
    for layer in layers:
        name = names.get(id(layer), "?") or "<root>"
        if isinstance(layer, nn.Conv2d):
            if layer.groups != 1:
                raise ValueError(f"grad-sample engine 'bk' supports Conv2d with groups=1 only; "
                                 f"module {name!r} ({layer}) has groups={layer.groups}")
        elif not isinstance(layer, nn.Linear):
            raise ValueError(f"grad-sample engine 'bk' supports only Conv2d and Linear layers with "
                             f"parameters; module {name!r} is a {type(layer).__name__}")
        for pname, p in layer.named_parameters(recurse=False):
            if pname not in ("weight", "bias"):
                raise ValueError(f"module {name!r} has an unexpected parameter {pname!r}")
        own = {id(p) for p in layer.parameters(recurse=False)}
        if own & seen:
            raise ValueError(f"module {name!r} shares a parameter with another layer (tied weights), "
                             "which grad-sample engine 'bk' does not support")
        seen |= own


def _padded_input(layer: nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The conv input with the layer's padding applied explicitly where unfold/conv can't express it."""
    if a.dim() != 4:
        raise ValueError(f"Conv2d input must be batched (B, C, H, W), got shape {tuple(a.shape)}")
    if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
        # 'same' may be asymmetric and non-zero modes pad before the conv; replay what the layer did.
        mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
        return F.pad(a, layer._reversed_padding_repeated_twice, mode=mode), (0, 0)
    return a, layer.padding


def _unfold_input(layer: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """Conv input (B, Cin, H, W) → patches (B, Cin·kh·kw, L), in the order of ``weight.view(Cout, -1)``."""
    a, padding = _padded_input(layer, a)
    return F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)


def _conv_per_example_weight(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per-example weight grads (B, Cout, Cin·kh·kw) as the weight grad of a conv with groups=B
    (the batch folded into channels): much faster on CPU than unfold + bmm."""
    a, padding = _padded_input(layer, a)
    batch, c_in, c_out = a.shape[0], a.shape[1], g.shape[1]
    grads = torch.nn.grad.conv2d_weight(
        a.reshape(1, batch * c_in, *a.shape[2:]), (batch * c_out, c_in, *layer.kernel_size),
        g.reshape(1, batch * c_out, *g.shape[2:]), stride=layer.stride, padding=padding,
        dilation=layer.dilation, groups=batch)
    return grads.view(batch, c_out, -1)


def _as_sequence(layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands in (B, D, L) layout, so that per-example grad of the weight is g @ aᵀ."""
    batch = a.shape[0]
    if isinstance(layer, nn.Conv2d):
        return _unfold_input(layer, a), g.reshape(batch, g.shape[1], -1)
    if a.dim() == 2:
        return a.unsqueeze(2), g.unsqueeze(2)
    # Linear on (B, ..., D): the middle dims are positions sharing the weight.
    return a.reshape(batch, -1, a.shape[-1]).transpose(1, 2), g.reshape(batch, -1, g.shape[-1]).transpose(1, 2)


def _sq_norms(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


class _LayerStats:
    """One layer's per-example squared norms and what its clipped sum needs.

    ``records`` holds (input, output grad) of each call of the layer in the forward pass (a
    layer called twice sums its per-example grads over the calls)."""

    def __init__(self, layer: nn.Module, records: list[tuple[torch.Tensor, torch.Tensor]],
                 batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layer = layer
        self.a = self.g = self.per_example_weight = self.bias_grads = None
        self.sq_norm = torch.zeros(batch, dtype=dtype, device=device)
        if not records:
            return
        conv = isinstance(layer, nn.Conv2d)
        weight, bias = layer.weight, layer.bias
        if bias is not None and bias.requires_grad:
            d_out = records[0][1].shape[1 if conv else -1]
            self.bias_grads = sum(g.reshape(batch, d_out, -1).sum(2) if conv else g.reshape(batch, -1, d_out).sum(1)
                                  for _, g in records)
            self.sq_norm = self.sq_norm + _sq_norms(self.bias_grads)
        if not weight.requires_grad:
            return
        d_out, d_in = weight.shape[0], weight[0].numel()
        positions = sum(g[0, 0].numel() if conv else g[0].numel() // d_out for _, g in records)
        if positions * positions <= d_in * d_out:
            # Ghost norm (L = 1: ‖a‖²‖g‖²; else ‖g aᵀ‖_F² = ⟨aᵀa, gᵀg⟩ over position pairs).
            seqs = [_as_sequence(layer, a, g) for a, g in records]
            self.a = torch.cat([a for a, _ in seqs], dim=2) if len(seqs) > 1 else seqs[0][0]
            self.g = torch.cat([g for _, g in seqs], dim=2) if len(seqs) > 1 else seqs[0][1]
            if positions == 1:
                self.sq_norm = self.sq_norm + _sq_norms(self.a) * _sq_norms(self.g)
            else:
                aa = torch.bmm(self.a.transpose(1, 2), self.a)
                gg = torch.bmm(self.g.transpose(1, 2), self.g)
                self.sq_norm = self.sq_norm + (aa * gg).sum(dim=(1, 2))
        else:
            if conv:
                per_call = (_conv_per_example_weight(layer, a, g) for a, g in records)
            else:
                per_call = (torch.bmm(g, a.transpose(1, 2)) for a, g in (_as_sequence(layer, *r) for r in records))
            self.per_example_weight = sum(per_call)  # (B, Dout, Din)
            self.sq_norm = self.sq_norm + _sq_norms(self.per_example_weight)

    def clipped_sums(self, factors: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Σ_i c_i ∇W_i and Σ_i c_i ∇b_i, in the parameters' shapes (None where not trainable)."""
        weight, bias = self.layer.weight, self.layer.bias
        weight_sum = bias_sum = None
        if weight.requires_grad:
            if self.per_example_weight is not None:
                weight_sum = (factors @ self.per_example_weight.reshape(factors.shape[0], -1)).reshape(weight.shape)
            elif self.a is not None:
                scaled = self.g * factors.view(-1, 1, 1)
                weight_sum = torch.einsum("bol,bil->oi", scaled, self.a).reshape(weight.shape)
            else:  # the layer did not influence the loss
                weight_sum = torch.zeros_like(weight)
        if bias is not None and bias.requires_grad:
            bias_sum = factors @ self.bias_grads if self.bias_grads is not None else torch.zeros_like(bias)
        return weight_sum, bias_sum


@register_engine("bk")
class BookKeepingEngine:
    """One forward and one output-gradient backward pass; Conv2d (groups=1) and Linear only."""

    name: str

    def clipped_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    clip_norm: float | Sequence[float], *, per_layer: bool = False) -> ClippedGrads:
        """Sum of per-example clipped gradients of ``cross_entropy(model(x), y, reduction='sum')``.

        Privacy: this is the clipping step of DP-SGD; each example's contribution to the
        returned sum has l2 norm ≤ C (or ≤ C_k per layer), so adding or removing one example
        moves the sum by at most C (sqrt(Σ C_k²)). The norms and counts are *not* private.
        """
        layers = parametrised_layers(model)
        names = {id(m): n for n, m in model.named_modules()}
        _check_supported(layers, names)
        if x.shape[0] == 0:
            return _empty_result(model, x, clip_norm, per_layer)
        _thresholds(clip_norm, per_layer, len(layers))

        records: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {id(m): [] for m in layers}

        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            records[id(module)].append((inputs[0].detach(), output, output._version))

        handles = [m.register_forward_hook(hook) for m in layers]
        try:
            with torch.enable_grad():
                logits = model(x)
        finally:
            for h in handles:
                h.remove()
        loss_sum = F.cross_entropy(logits, y, reduction="sum")

        outputs = [out for recs in records.values() for (_, out, _) in recs]
        for layer in layers:
            for _, out, version in records[id(layer)]:
                if out._version != version:
                    raise ValueError(f"the output of module {names.get(id(layer))!r} was modified in place "
                                     "(e.g. ReLU(inplace=True)); grad-sample engine 'bk' needs it intact")
        needs_grad = [o for o in outputs if o.requires_grad]
        out_grads = dict.fromkeys(map(id, outputs))
        if needs_grad:
            got = torch.autograd.grad(loss_sum, needs_grad, allow_unused=True)
            out_grads.update({id(o): gr for o, gr in zip(needs_grad, got)})

        batch = x.shape[0]
        params = list(model.parameters())
        dtype, device = params[0].dtype, params[0].device
        stats = []
        with torch.no_grad():
            for layer in layers:
                pairs = [(a, out_grads[id(out)]) for a, out, _ in records[id(layer)]
                         if out_grads[id(out)] is not None]
                stats.append(_LayerStats(layer, pairs, batch, dtype, device))
            per_layer_norms = torch.stack([s.sq_norm for s in stats], dim=1).clamp(min=0).sqrt()
            factors, num_clipped = clip_factors(per_layer_norms, clip_norm, per_layer)

            index = {id(p): j for j, p in enumerate(params)}
            grads: list[torch.Tensor | None] = [None] * len(params)
            for k, s in enumerate(stats):
                weight_sum, bias_sum = s.clipped_sums(factors[:, k].contiguous())
                for p, value in ((s.layer.weight, weight_sum), (s.layer.bias, bias_sum)):
                    if p is not None and grads[index[id(p)]] is None:
                        grads[index[id(p)]] = value
            grads = [torch.zeros_like(p) if gr is None else gr.detach() for p, gr in zip(params, grads)]
        return ClippedGrads(grads=grads, per_example_norms=per_layer_norms.pow(2).sum(1).sqrt(),
                            num_clipped=num_clipped, loss_sum=float(loss_sum.detach()),
                            per_layer_norms=per_layer_norms)


@register_engine("vmap")
class VmapEngine:
    """Materialises every per-example gradient with ``vmap(grad(loss))``: simple, general, memory B·d."""

    name: str

    def clipped_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    clip_norm: float | Sequence[float], *, per_layer: bool = False) -> ClippedGrads:
        """Same contract as :meth:`BookKeepingEngine.clipped_sum` (same privacy statement)."""
        from torch.func import functional_call, grad_and_value, vmap

        groups = layer_param_indices(model)
        if x.shape[0] == 0:
            return _empty_result(model, x, clip_norm, per_layer)
        _thresholds(clip_norm, per_layer, len(groups))
        named = dict(model.named_parameters())
        trainable = {n: p.detach() for n, p in named.items() if p.requires_grad}
        frozen = {n: p.detach() for n, p in named.items() if not p.requires_grad}
        buffers = dict(model.named_buffers())

        def example_loss(train_params, xi, yi):
            logits = functional_call(model, {**train_params, **frozen, **buffers}, (xi.unsqueeze(0),))
            return F.cross_entropy(logits, yi.unsqueeze(0), reduction="sum")

        try:
            per_example, losses = vmap(grad_and_value(example_loss), in_dims=(None, 0, 0))(trainable, x, y)
        except RuntimeError as err:
            raise ValueError(f"grad-sample engine 'vmap' cannot transform this model: {err}") from err
        with torch.no_grad():
            names = list(named)
            batch = x.shape[0]
            dtype = next(iter(named.values())).dtype
            sq = torch.zeros(batch, len(groups), dtype=dtype, device=x.device)
            for k, ids in enumerate(groups):
                for j in ids:
                    if names[j] in per_example:
                        sq[:, k] += per_example[names[j]].reshape(batch, -1).pow(2).sum(1)
            per_layer_norms = sq.sqrt()
            factors, num_clipped = clip_factors(per_layer_norms, clip_norm, per_layer)
            layer_of = {j: k for k, ids in enumerate(groups) for j in ids}
            grads = []
            for j, (n, p) in enumerate(named.items()):
                if n in per_example:
                    c = factors[:, layer_of[j]]
                    grads.append((c @ per_example[n].reshape(batch, -1)).reshape(p.shape))
                else:
                    grads.append(torch.zeros_like(p))
        return ClippedGrads(grads=grads, per_example_norms=sq.sum(1).sqrt(), num_clipped=num_clipped,
                            loss_sum=float(losses.sum()), per_layer_norms=per_layer_norms)
