"""Per-example gradient norms and sums of per-example clipped gradients.

An engine answers one question for a batch: given per-example losses (cross-entropy), what is
each example's gradient norm, and what is ``Σ_i c_i ∇ℓ_i`` with the DP-SGD clip factors
``c_i = min(1, C / (‖∇ℓ_i‖ + 1e-6))``? It adds no noise: ``raysim.privacy.clipping`` draws the
noise and passes it as ``out`` with ``scale = 1/B``, and the engine adds ``scale · Σ_i c_i ∇ℓ_i``
to it in place.

``bk`` (default) is the book-keeping engine (Bu et al. 2022; ghost norm of Goodfellow 2015 and
Li et al. 2021). One forward pass records each layer's input activation ``a``; one backward pass
(``torch.autograd.grad`` of the summed loss with respect to the layer *outputs*, so autograd never
computes weight gradients) gives the output gradients ``g``. Each layer's per-example squared
norms come from the ghost norm or from materialised per-example grads, whichever its shapes make
cheaper, and its clipped sum ``Σ_i c_i G_i`` is one contraction; the per-layer rules live in
:mod:`raysim.privacy.layer_grads`. A layer called several times in one forward pass (a recurrent
cell's Linear, once per step) has its per-example gradients summed over its calls. Custom autograd
functions between layers (LLDM's top-k gradient sparsifier) are handled because ``g`` is what the
real backward pass delivers at each layer output. Supported parametrised modules: Conv2d
(groups=1), Linear (on (B, D) or on (B, ..., D) sequences), GroupNorm, Embedding (without
``max_norm`` or ``scale_grad_by_freq``); refused with a ValueError: any other, tied weights, layer
outputs modified in place.

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

from raysim.metrics import channels_last
from raysim.privacy.layer_grads import LayerStats, check_supported

__all__ = [
    "ClippedGrads", "GradSampleEngine", "BookKeepingEngine", "VmapEngine", "ENGINES", "SparseExamples", "LayerCanaries",
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
                    clip_norm: float | Sequence[float], *, per_layer: bool = False,
                    scale: float = 1.0, out: list[torch.Tensor] | None = None,
                    extra: SparseExamples | None = None) -> ClippedGrads:
        """Per-example norms and ``scale · Σ_i c_i ∇ℓ_i`` of the summed CE loss; with ``out`` (one
        tensor per parameter, in its shape), that sum is added to ``out`` in place and
        ``ClippedGrads.grads`` are those tensors. ``extra`` (the privacy audit's canaries only): k more
        examples, given either by what the ``bk`` engine records of an example (:class:`LayerCanaries`:
        their rows join the batch's recorded pairs, so their norms and clipped sums are computed by the
        same per-layer code) or by their sparse unclipped gradients (:class:`SparseExamples`: their
        per-layer norms join the batch's before the clip factors are computed, and their clipped
        gradients join the sum); either way their clip factors come from the batch's one
        :func:`clip_factors` call."""
        ...

    def example_norms(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(B,) pre-clipping per-example gradient norms of the CE loss, nothing else computed."""
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


def _empty_result(model: nn.Module, x: torch.Tensor, clip_norm, per_layer: bool,
                  out: list[torch.Tensor] | None = None) -> ClippedGrads:
    num_layers = len(parametrised_layers(model))
    _thresholds(clip_norm, per_layer, num_layers)
    params = list(model.parameters())
    dtype = params[0].dtype if params else x.dtype
    grads = out if out is not None else [torch.zeros_like(p, memory_format=torch.contiguous_format).detach()
                                         for p in params]
    return ClippedGrads(grads=grads,
                        per_example_norms=torch.zeros(0, dtype=dtype, device=x.device),
                        num_clipped=0, loss_sum=0.0,
                        per_layer_norms=torch.zeros(0, num_layers, dtype=dtype, device=x.device))


@dataclass(frozen=True)
class SparseExamples:
    """k extra examples given by sparse unclipped gradients (the privacy audit's canaries): entry
    (c, s) of example c is ``values[c, s]`` at flat position ``index[c, s]`` of parameter
    ``param[c, s]`` (``model.parameters()`` order). Entries must not repeat a coordinate within a
    parameter, so the clipped sum adds each coordinate once and its bits do not depend on order."""

    param: torch.Tensor    # (k, s) int64
    index: torch.Tensor    # (k, s) int64
    values: torch.Tensor   # (k, s)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def _layers(self, groups: list[list[int]]) -> torch.Tensor:
        layer_of = torch.zeros(1 + max(j for ids in groups for j in ids), dtype=torch.int64)
        for layer, ids in enumerate(groups):
            layer_of[ids] = layer
        return layer_of.to(self.param.device)[self.param]

    def layer_norms(self, groups: list[list[int]]) -> torch.Tensor:
        """(k, K) per-layer norms, K = len(groups)."""
        sq = torch.zeros(len(self), len(groups), dtype=self.values.dtype, device=self.values.device)
        return sq.scatter_add_(1, self._layers(groups), self.values.pow(2)).sqrt()

    def add_to(self, grads: list[torch.Tensor], factors: torch.Tensor, groups: list[list[int]]) -> None:
        """grads += Σ_c factors[c, layer] · g_c, layer by layer (the extra examples' clipped sum)."""
        weighted = factors.to(self.values).gather(1, self._layers(groups)) * self.values
        for j in torch.unique(self.param).tolist():
            hit = self.param == j
            where = torch.unravel_index(self.index[hit].to(grads[j].device), grads[j].shape)
            grads[j].index_put_(where, weighted[hit].to(grads[j]), accumulate=True)


@dataclass(frozen=True)
class LayerCanaries:
    """k extra examples given by what the book-keeping engine records of an example: at each
    parametrised layer, the layer's input activation and the gradient of the loss with respect to its
    output (the privacy audit's canaries, ``raysim.audit``). Extra example c lives in one layer,
    ``layer[c]``: its pair there is ``inputs[layer][j]``, ``output_grads[layer][j]`` (j: its rank among
    that layer's extra examples, which come in ascending layer order), and it is zero at every other layer.
    The engine appends these rows to the batch's recorded pairs, so the extra examples' per-example norms
    and clipped sums are computed by the same :class:`~raysim.privacy.layer_grads.LayerStats` code as the
    batch's, and their clip factors by the same :func:`clip_factors` call."""

    layer: torch.Tensor                       # (k,) int64, ascending
    inputs: tuple[torch.Tensor, ...]          # per parametrised layer: (k_l, *per-example input shape)
    output_grads: tuple[torch.Tensor, ...]    # per parametrised layer: (k_l, *per-example output shape)

    def __len__(self) -> int:
        return int(self.layer.shape[0])

    def pair(self, k: int, like_a: torch.Tensor | None = None,
             like_g: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The k extra rows of layer ``k``'s (input, output grad): the layer's own extra examples at their
        rows, zeros elsewhere (in the dtype and device of ``like_a``/``like_g`` when given)."""
        a_k, g_k = self.inputs[k], self.output_grads[k]
        if like_a is not None:
            a_k, g_k = a_k.to(like_a), g_k.to(like_g)
        n = len(self)
        start = int((self.layer < k).sum())
        a = a_k.new_zeros((n, *a_k.shape[1:]))
        g = g_k.new_zeros((n, *g_k.shape[1:]))
        a[start:start + a_k.shape[0]] = a_k
        g[start:start + g_k.shape[0]] = g_k
        return a, g


def _with_canaries(pairs: list[tuple[torch.Tensor, torch.Tensor]], extra: LayerCanaries,
                   k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A layer's recorded (input, output grad) pairs with the extra examples' rows appended: to the
    layer's first call their pair at this layer, to any later call zeros."""
    if not pairs:
        return [extra.pair(k)]
    a0, g0 = pairs[0]
    ea, eg = extra.pair(k, a0, g0)
    out = [(torch.cat([a0, ea]), torch.cat([g0, eg]))]
    for a, g in pairs[1:]:
        out.append((torch.cat([a, a.new_zeros((len(extra), *a.shape[1:]))]),
                    torch.cat([g, g.new_zeros((len(extra), *g.shape[1:]))])))
    return out


def _empty_batch(model: nn.Module, x: torch.Tensor, clip_norm, per_layer: bool, scale: float,
                 out: list[torch.Tensor] | None, extra: SparseExamples | None) -> ClippedGrads:
    """An empty batch: nothing but the extra examples, if any, clipped like any example."""
    res = _empty_result(model, x, clip_norm, per_layer, out)
    if extra is not None and len(extra):
        groups = layer_param_indices(model)
        factors, res.num_clipped = _clip_factors_with(res.per_layer_norms, extra, groups, clip_norm, per_layer, scale)
        extra.add_to(res.grads, factors, groups)
    return res


def _clip_factors_with(norms: torch.Tensor, extra: SparseExamples | None, groups: list[list[int]],
                       clip_norm: float | Sequence[float], per_layer: bool, scale: float) -> tuple[torch.Tensor, int]:
    """:func:`clip_factors` times ``scale`` for the batch's examples (the rows of ``norms``), followed by
    the rows of the ``extra`` examples, clipped by the same rule."""
    if extra is not None:
        norms = torch.cat([norms, extra.layer_norms(groups).to(norms)])
    factors, num_clipped = clip_factors(norms, clip_norm, per_layer)
    return (factors * scale if scale != 1.0 else factors), num_clipped


@register_engine("bk")
class BookKeepingEngine:
    """One forward and one output-gradient backward pass; Conv2d (groups=1), Linear, GroupNorm, Embedding.

    ``on_phase``, when set, is called with a phase name as each phase of :meth:`clipped_sum` ends
    (``forward``, ``backward``, ``norms <layer>``, ``clip factors``, ``clipped sum <layer>``): the
    profiling hook of ``experiments/bench/dp_step.py --profile``. Unset in runs."""

    name: str
    on_phase: Callable[[str], None] | None = None

    def clipped_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    clip_norm: float | Sequence[float], *, per_layer: bool = False,
                    scale: float = 1.0, out: list[torch.Tensor] | None = None,
                    extra: SparseExamples | None = None) -> ClippedGrads:
        """Sum of per-example clipped gradients of ``cross_entropy(model(x), y, reduction='sum')``,
        times ``scale`` (folded into the clip factors), added to ``out`` when given.

        Privacy: this is the clipping step of DP-SGD; each example's contribution to the
        returned sum has l2 norm ≤ C (or ≤ C_k per layer), so adding or removing one example
        moves the sum by at most C (sqrt(Σ C_k²)). The norms and counts are *not* private.
        """
        return self._run(model, x, y, clip_norm, per_layer, scale, out, norms_only=False, extra=extra)

    def example_norms(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The per-example norms of :meth:`clipped_sum` (the same bits), without the clipped sum."""
        return self._run(model, x, y, 1.0, False, 1.0, None, norms_only=True).per_example_norms

    def _run(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip_norm: float | Sequence[float],
             per_layer: bool, scale: float, out: list[torch.Tensor] | None, *, norms_only: bool,
             extra: SparseExamples | None = None) -> ClippedGrads:
        layers = parametrised_layers(model)
        names = {id(m): n for n, m in model.named_modules()}
        check_supported(layers, names)
        canaries = extra if isinstance(extra, LayerCanaries) and len(extra) else None
        if isinstance(extra, LayerCanaries):
            extra = None
        if x.shape[0] == 0:
            if canaries is None:
                return _empty_batch(model, x, clip_norm, per_layer, scale, out, extra)
            return self._canaries_only(model, layers, clip_norm, per_layer, scale, out, canaries)
        _thresholds(clip_norm, per_layer, len(layers))

        records: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {id(m): [] for m in layers}

        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            records[id(module)].append((inputs[0].detach(), output, output._version))

        handles = [m.register_forward_hook(hook) for m in layers]
        try:
            with torch.enable_grad():
                nhwc = channels_last(x)
                try:
                    logits = model(nhwc)
                except RuntimeError:
                    if nhwc is x:
                        raise
                    # A model that .view()s its feature maps needs NCHW: run it as given.
                    for recs in records.values():
                        recs.clear()
                    logits = model(x)
        finally:
            for h in handles:
                h.remove()
        loss_sum = F.cross_entropy(logits, y, reduction="sum")
        lap = self.on_phase
        if lap is not None:
            lap("forward")

        outputs = [output for recs in records.values() for (_, output, _) in recs]
        for layer in layers:
            for _, output, version in records[id(layer)]:
                if output._version != version:
                    raise ValueError(f"the output of module {names.get(id(layer))!r} was modified in place "
                                     "(e.g. ReLU(inplace=True)); grad-sample engine 'bk' needs it intact")
        needs_grad = [o for o in outputs if o.requires_grad]
        out_grads = dict.fromkeys(map(id, outputs))
        if needs_grad:
            got = torch.autograd.grad(loss_sum, needs_grad, allow_unused=True)
            out_grads.update({id(o): gr for o, gr in zip(needs_grad, got)})
        if lap is not None:
            lap("backward")

        batch = x.shape[0]
        rows = batch + (len(canaries) if canaries is not None else 0)
        params = list(model.parameters())
        dtype, device = params[0].dtype, params[0].device
        stats = []
        with torch.no_grad():
            for k, layer in enumerate(layers):
                pairs = [(a, out_grads[id(output)]) for a, output, _ in records[id(layer)]
                         if out_grads[id(output)] is not None]
                if canaries is not None:
                    pairs = _with_canaries(pairs, canaries, k)
                stats.append(LayerStats(layer, pairs, rows, dtype, device))
                if lap is not None:
                    lap(f"norms {names.get(id(layer))}")
            per_layer_norms = torch.stack([s.sq_norm for s in stats], dim=1).clamp(min=0).sqrt()
            if norms_only:
                return ClippedGrads(grads=[], per_example_norms=per_layer_norms.pow(2).sum(1).sqrt(),
                                    num_clipped=0, loss_sum=float(loss_sum.detach()), per_layer_norms=per_layer_norms)
            groups = layer_param_indices(model) if extra is not None else []
            factors, num_clipped = _clip_factors_with(per_layer_norms, extra, groups, clip_norm, per_layer, scale)
            if lap is not None:
                lap("clip factors")

            index = {id(p): j for j, p in enumerate(params)}
            grads: list[torch.Tensor | None] = [None] * len(params)
            for k, s in enumerate(stats):
                into = None if out is None else {
                    pname: out[index[id(p)]] for pname, p in s.layer.named_parameters(recurse=False)}
                for pname, value in s.clipped_sums(factors[:rows, k].contiguous(), into).items():
                    j = index[id(getattr(s.layer, pname))]
                    if grads[j] is None:
                        grads[j] = value
                if lap is not None:
                    lap(f"clipped sum {names.get(id(s.layer))}")
            grads = [gr.detach() if gr is not None else torch.zeros_like(p) if out is None else out[j]
                     for j, (p, gr) in enumerate(zip(params, grads))]
            if extra is not None:
                extra.add_to(grads, factors[batch:], groups)
        per_layer_norms = per_layer_norms[:batch]
        return ClippedGrads(grads=grads, per_example_norms=per_layer_norms.pow(2).sum(1).sqrt(),
                            num_clipped=num_clipped, loss_sum=float(loss_sum.detach()),
                            per_layer_norms=per_layer_norms)

    def _canaries_only(self, model: nn.Module, layers: list[nn.Module], clip_norm, per_layer: bool, scale: float,
                       out: list[torch.Tensor] | None, canaries: LayerCanaries) -> ClippedGrads:
        """An empty batch with extra examples: their pairs alone go through the same per-layer code."""
        _thresholds(clip_norm, per_layer, len(layers))
        params = list(model.parameters())
        dtype, device = params[0].dtype, params[0].device
        index = {id(p): j for j, p in enumerate(params)}
        with torch.no_grad():
            stats = [LayerStats(layer, [canaries.pair(k)], len(canaries), dtype, device)
                     for k, layer in enumerate(layers)]
            norms = torch.stack([s.sq_norm for s in stats], dim=1).clamp(min=0).sqrt()
            factors, _ = clip_factors(norms, clip_norm, per_layer)
            factors = factors * scale if scale != 1.0 else factors
            grads = out if out is not None else [torch.zeros_like(p) for p in params]
            for k, s in enumerate(stats):
                into = {pname: grads[index[id(p)]] for pname, p in s.layer.named_parameters(recurse=False)}
                s.clipped_sums(factors[:, k].contiguous(), into)
        return ClippedGrads(grads=grads, per_example_norms=torch.zeros(0, dtype=dtype, device=device), num_clipped=0,
                            loss_sum=0.0, per_layer_norms=torch.zeros(0, len(layers), dtype=dtype, device=device))


@register_engine("vmap")
class VmapEngine:
    """Materialises every per-example gradient with ``vmap(grad(loss))``: simple, general, memory B·d."""

    name: str

    def clipped_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    clip_norm: float | Sequence[float], *, per_layer: bool = False,
                    scale: float = 1.0, out: list[torch.Tensor] | None = None,
                    extra: SparseExamples | None = None) -> ClippedGrads:
        """Same contract as :meth:`BookKeepingEngine.clipped_sum` (same privacy statement)."""
        return self._run(model, x, y, clip_norm, per_layer, scale, out, extra)

    def example_norms(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The per-example norms of :meth:`clipped_sum`."""
        return self._run(model, x, y, 1.0, False, 1.0, None).per_example_norms

    def _run(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip_norm: float | Sequence[float],
             per_layer: bool, scale: float, out: list[torch.Tensor] | None,
             extra: SparseExamples | None = None) -> ClippedGrads:
        from torch.func import functional_call, grad_and_value, vmap

        if isinstance(extra, LayerCanaries):
            raise ValueError("grad-sample engine 'vmap' takes extra examples as SparseExamples, not LayerCanaries "
                             "(it records no per-layer pairs)")
        groups = layer_param_indices(model)
        if x.shape[0] == 0:
            return _empty_batch(model, x, clip_norm, per_layer, scale, out, extra)
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
            factors, num_clipped = _clip_factors_with(per_layer_norms, extra, groups, clip_norm, per_layer, scale)
            layer_of = {j: k for k, ids in enumerate(groups) for j in ids}
            grads = []
            for j, (n, p) in enumerate(named.items()):
                if n in per_example:
                    c = factors[:batch, layer_of[j]]
                    grads.append((c @ per_example[n].reshape(batch, -1)).reshape(p.shape))
                else:
                    grads.append(torch.zeros_like(p))
            if out is not None:
                grads = [o.add_(g) for o, g in zip(out, grads)]
            if extra is not None:
                extra.add_to(grads, factors[batch:], groups)
        return ClippedGrads(grads=grads, per_example_norms=sq.sum(1).sqrt(), num_clipped=num_clipped,
                            loss_sum=float(losses.sum()), per_layer_norms=per_layer_norms)
