"""Per-layer pieces of the book-keeping engine: per-example squared gradient norms of one layer
from its recorded input activations ``a`` and output gradients ``g``, and the layer's sum of
clipped per-example gradients once the clip factors are known.

Which way a layer is handled is a fixed function of its shapes (never of timings, so that the
result, down to the last bit, does not depend on the machine's load):

- ``Linear`` on (B, D), called once: ghost norm ``‖a_i‖²‖g_i‖²``; the clipped sum is one ``mm`` of
  the pre-scaled ``g`` with ``a``, the same call plain backprop makes.
- ``Conv2d``, and ``Linear`` on sequences or called several times (a recurrent layer, once per
  step), with T output positions over all its calls: per-example grad ``G_i = Σ_t g_it a_itᵀ``
  (D_out × D_in). The ghost norm ``⟨A_i A_iᵀ, G_i G_iᵀ⟩`` (A_i: the T × D_in rows of example i's
  inputs, G_i its T × D_out output gradients) costs about ``B·T²·(D_in + D_out)`` multiply-adds,
  the explicit ``G_i`` ``B·T·D_in·D_out``; the cheaper is taken (mixed ghost clipping, Bu et al.
  2022, with the cost model of both contractions rather than memory alone). A Linear's calls are
  gathered into one (B, T, D) block of rows, so either way is one batched matmul (an explicit
  ``G_i`` held transposed, D_in × D_out, when D_out > D_in: the faster orientation), and its clipped
  sum on the ghost path is one ``mm`` of the pre-scaled output-gradient rows with the input rows
  (B·T rows), what plain backprop computes. On the ghost path a conv's clipped sum is one ordinary weight-gradient
  call with the output gradients pre-scaled by the clip factors. An explicit conv ``G_i`` is, for
  few input channels, held transposed, ``G_iᵀ`` (D_in × D_out): a batched matmul of the input's
  patches (a strided view of the padded NCHW input, copied 2 MB of the batch at a time) with the
  channels-last output gradients; else the weight gradient of a conv with groups=B, a few MB of
  the batch at a time (one call over the whole batch needs a workspace several times the result).
  The clipped sum of explicit ``G_i`` is a (B)·(B × D_out·D_in) product per chunk (a transposed
  layout's small result is transposed back to the weight's shape).
- ``GroupNorm`` (affine): per-example ``dγ_c = Σ g·x̂`` and ``dβ_c = Σ g`` over the channel's
  positions, with ``x̂`` the normalised input, recomputed from the recorded input.
- ``Embedding`` (V × D table) on T token positions: example i's gradient is the scatter of its
  output gradients g_it to the rows of its tokens, ``E_i[v] = Σ_{t: x_it = v} g_it``. Its squared norm
  comes either from that scatter, a (B, V, D) tensor (about ``B·(V + T)·D`` work and memory), or
  from the ghost norm over pairs of positions holding the same token,
  ``Σ_{t,s: x_it = x_is} ⟨g_it, g_is⟩`` (``B·T²·(D + 1)``, no V-sized tensor), whichever its shapes
  make cheaper: the scatter for a character vocabulary (V = 80, T = 80), the ghost norm for a word
  vocabulary of thousands with short windows. The clipped sum is one ``index_add`` of the pre-scaled
  output gradients into the table's rows (B·T rows of D), what plain backprop computes. The padding
  row, if any, gets no gradient; ``max_norm`` (which rewrites the table in the forward pass) and
  ``scale_grad_by_freq`` (which scales a gradient by counts over the whole batch) are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SUPPORTED", "check_supported", "LayerStats"]

#: Parametrised module types the book-keeping engine handles.
SUPPORTED = (nn.Conv2d, nn.Linear, nn.GroupNorm, nn.Embedding)

#: At most this many input channels, an explicit conv per-example grad is a batched matmul of the
#: input's NCHW patches with the channels-last output gradients (:func:`_conv_im2col`); above, the
#: weight grad of a conv with groups=B. Measured on CPU at batch 64, 1 thread, per-example grads and
#: their norms: 3→32 5x5 on 32x32 (the paper CNN's conv1) 6.4 ms, against 9.1 ms for a matmul over
#: NHWC patches giving the weight's (Cout, Cin·kh·kw) order (its patch copy gathers runs of 3 floats
#: and its result needs reordering) and 21.3 ms with groups=B; 32→64 5x5 on 16x16 about the same
#: either way (31–32 ms), so the groups=B conv, which copies no patches, is kept there.
IM2COL_MAX_IN_CHANNELS = 4
#: Explicit conv per-example grads are computed and held this many bytes of the batch at a time.
CHUNK_BYTES = 4 * 2**20
#: The input patches of :func:`_conv_im2col` are copied this many bytes of the batch at a time,
#: so that they are still in cache for the matmul.
IM2COL_CHUNK_BYTES = 2 * 2**20


def check_supported(layers: list[nn.Module], names: dict[int, str]) -> None:
    """ValueError naming the first module the engine cannot handle, or a parameter tied between two."""
    seen: set[int] = set()
    for layer in layers:
        name = names.get(id(layer), "?") or "<root>"
        if isinstance(layer, nn.Conv2d):
            if layer.groups != 1:
                raise ValueError(f"grad-sample engine 'bk' supports Conv2d with groups=1 only; "
                                 f"module {name!r} ({layer}) has groups={layer.groups}")
        elif isinstance(layer, nn.Embedding):
            if layer.max_norm is not None or layer.scale_grad_by_freq:
                raise ValueError(f"grad-sample engine 'bk' supports Embedding without max_norm and "
                                 f"scale_grad_by_freq only; module {name!r} ({layer}) sets one")
        elif not isinstance(layer, SUPPORTED):
            raise ValueError(f"grad-sample engine 'bk' supports only Conv2d, Linear, GroupNorm and Embedding "
                             f"layers with parameters; module {name!r} is a {type(layer).__name__}")
        for pname, _ in layer.named_parameters(recurse=False):
            if pname not in ("weight", "bias"):
                raise ValueError(f"module {name!r} has an unexpected parameter {pname!r}")
        own = {id(p) for p in layer.parameters(recurse=False)}
        if own & seen:
            raise ValueError(f"module {name!r} shares a parameter with another layer (tied weights), "
                             "which grad-sample engine 'bk' does not support")
        seen |= own


def _padded_input(layer: nn.Conv2d, a: torch.Tensor, explicit: bool = False) -> tuple[torch.Tensor, tuple[int, int]]:
    """The conv input with the layer's padding applied explicitly where the call can't express
    it (always, with ``explicit``); returns the padding left for the call."""
    if a.dim() != 4:
        raise ValueError(f"Conv2d input must be batched (B, C, H, W), got shape {tuple(a.shape)}")
    if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
        # 'same' may be asymmetric and non-zero modes pad before the conv; replay what the layer did.
        mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
        return F.pad(a, layer._reversed_padding_repeated_twice, mode=mode), (0, 0)
    if explicit and any(layer.padding):
        ph, pw = layer.padding
        return F.pad(a, (pw, pw, ph, ph)), (0, 0)
    return a, layer.padding


def _conv_grouped(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per-example weight grads (B, Cout, Cin·kh·kw) as the weight grad of a conv with groups=B."""
    a, padding = _padded_input(layer, a)
    batch, c_in, c_out = a.shape[0], a.shape[1], g.shape[1]
    grads = torch.nn.grad.conv2d_weight(
        a.reshape(1, batch * c_in, *a.shape[2:]), (batch * c_out, c_in, *layer.kernel_size),
        g.reshape(1, batch * c_out, *g.shape[2:]), stride=layer.stride, padding=padding,
        dilation=layer.dilation, groups=batch)
    return grads.view(batch, c_out, -1)


def _conv_patches(layer: nn.Conv2d, a: torch.Tensor, out_size: tuple[int, int]) -> torch.Tensor:
    """Input patches (B, Cin·kh·kw, Ho·Wo), rows in the order of ``weight.view(Cout, -1)``: a
    strided view of the padded input copied to NCHW, whose window rows are runs of the input's rows."""
    a, _ = _padded_input(layer, a, explicit=True)
    a = a.contiguous()                   # NCHW: a view for an NCHW input without padding
    batch, c_in = a.shape[0], a.shape[1]
    kh, kw = layer.kernel_size
    (sh, sw), (dh, dw) = layer.stride, layer.dilation
    h_out, w_out = out_size
    sb, sc, sr, scol = a.stride()
    windows = a.as_strided((batch, c_in, kh, kw, h_out, w_out), (sb, sc, sr * dh, scol * dw, sr * sh, scol * sw))
    return windows.reshape(batch, c_in * kh * kw, h_out * w_out)


def _conv_im2col(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Transposed per-example weight grads (B, Cin·kh·kw, Cout) as one batched matmul.

    ``∇W_i[o, k] = Σ_l P_i[k, l] · g_i[o, l]`` with ``P_i`` example i's input patches
    (:func:`_conv_patches`) and l the output positions: ``P_i`` (Cin·kh·kw, Ho·Wo) times the
    channels-last output gradients, which are (Ho·Wo, Cout) in memory, is ``∇W_iᵀ`` with neither
    operand transposed in memory.
    """
    batch, c_out, h_out, w_out = g.shape
    patches = _conv_patches(layer, a, (h_out, w_out))
    g_rows = g.permute(0, 2, 3, 1).reshape(batch, h_out * w_out, c_out)   # a view for channels-last g
    return torch.bmm(patches, g_rows)


def _conv_weight_grad(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The ordinary (batch-summed) weight gradient of ``layer`` for input ``a`` and output grad ``g``."""
    a, padding = _padded_input(layer, a)
    return torch.nn.grad.conv2d_weight(a, layer.weight.shape, g, stride=layer.stride, padding=padding,
                                       dilation=layer.dilation)


def _unfold_input(layer: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """Conv input (B, Cin, H, W) → patches (B, Cin·kh·kw, L), in the order of ``weight.view(Cout, -1)``."""
    a, padding = _padded_input(layer, a)
    return F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)


def _conv_sequence(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv's input patches and output gradients as (B, D, L), so that a per-example weight grad is g @ aᵀ."""
    return _unfold_input(layer, a), g.reshape(g.shape[0], g.shape[1], -1)


def _rows(tensors: list[torch.Tensor], batch: int, width: int) -> torch.Tensor:
    """A layer's recorded (B, ..., width) tensors of all its calls as one (B, L, width) block of rows
    (a view for a single call on contiguous rows; a copy gathering the calls otherwise)."""
    if len(tensors) == 1:
        return tensors[0].reshape(batch, -1, width)
    return torch.cat([t.reshape(batch, -1, width) for t in tensors], dim=1)


def embedding_uses_ghost_norm(vocab: int, dim: int, positions: int) -> bool:
    """Whether an Embedding's per-example norms come from the ghost norm over position pairs (cost
    ``T²·(D + 1)`` an example) rather than from the scattered (V, D) gradient (``(V + T)·D``)."""
    return positions * positions * (dim + 1) < (vocab + positions) * dim


def _sq_norms(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def _total(tensors) -> torch.Tensor:
    """Sum over a layer's calls; unlike ``sum()``, no ``0 + t`` copy for the usual single call."""
    it = iter(tensors)
    total = next(it)
    for t in it:
        total = total + t
    return total


def _uses_im2col(layer: nn.Conv2d) -> bool:
    """Whether the layer's per-example weight grads come from :func:`_conv_im2col`, held transposed."""
    return layer.in_channels <= IM2COL_MAX_IN_CHANNELS


def _conv_per_example_chunks(layer: nn.Conv2d, records, batch: int) -> list[torch.Tensor]:
    """Per-example weight grads, summed over the layer's calls, as consecutive chunks of the batch:
    with :func:`_conv_im2col` (transposed, (b, Cin·kh·kw, Cout)) of at most ``IM2COL_CHUNK_BYTES``
    of input patches each (the patches of a 32x32 RGB batch of 64 under a 5x5 kernel take 20 MB);
    else with :func:`_conv_grouped` ((b, Cout, Cin·kh·kw)) of at most ``CHUNK_BYTES`` of grads each
    (oneDNN's workspace for one groups=B call over the whole batch is several times the result)."""
    weight = layer.weight
    if _uses_im2col(layer):
        compute, budget = _conv_im2col, IM2COL_CHUNK_BYTES
        per_example = max(records[0][1][0, 0].numel(), weight.shape[0]) * weight[0].numel()
    else:
        compute, budget = _conv_grouped, CHUNK_BYTES
        per_example = weight.numel()
    size = max(1, budget // (per_example * weight.element_size()))
    return [_total(compute(layer, a[start:start + size], g[start:start + size]) for a, g in records)
            for start in range(0, batch, size)]


def _weighted_sum(factors: torch.Tensor, chunks: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """``Σ_i c_i G_i`` from per-example ``G_i`` held in consecutive chunks of the batch."""
    total, start = None, 0
    for chunk in chunks:
        part = factors[start:start + chunk.shape[0]] @ chunk.reshape(chunk.shape[0], -1)
        total = part if total is None else total.add_(part)
        start += chunk.shape[0]
    return total.reshape(shape)


class LayerStats:
    """One layer's per-example squared norms and what its clipped sum needs.

    ``records`` holds (input, output grad) of each call of the layer in the forward pass (a
    layer called twice sums its per-example grads over the calls)."""

    def __init__(self, layer: nn.Module, records: list[tuple[torch.Tensor, torch.Tensor]],
                 batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layer = layer
        self.a = self.g = self.scaled_records = self.tokens = None
        # parameter name → per-example grads (B, ...) as consecutive chunks of the batch
        self.per_example: dict[str, list[torch.Tensor]] = {}
        # per_example["weight"] holds each example's (D_in, D_out) transpose of the weight's (D_out, D_in)
        # (a conv's from the patch matmul, a Linear's with more outputs than inputs)
        self.weight_transposed = False
        self.sq_norm = torch.zeros(batch, dtype=dtype, device=device)
        if not records:
            return
        if isinstance(layer, nn.GroupNorm):
            self._group_norm(records)
        elif isinstance(layer, nn.Embedding):
            self._embedding(records, batch)
        else:
            self._bias(records, batch)
            if layer.weight.requires_grad:
                self._weight(records)
        for chunks in self.per_example.values():
            self.sq_norm = self.sq_norm + torch.cat([_sq_norms(t) for t in chunks])

    def _group_norm(self, records) -> None:
        layer = self.layer
        d_gamma = d_beta = None
        for a, g in records:
            dims = tuple(range(2, g.dim()))
            if layer.weight is not None and layer.weight.requires_grad:
                x_hat = F.group_norm(a, layer.num_groups, eps=layer.eps)
                d = (g * x_hat).sum(dim=dims) if dims else g * x_hat
                d_gamma = d if d_gamma is None else d_gamma + d
            if layer.bias is not None and layer.bias.requires_grad:
                d = g.sum(dim=dims) if dims else g
                d_beta = d if d_beta is None else d_beta + d
        if d_gamma is not None:
            self.per_example["weight"] = [d_gamma]
        if d_beta is not None:
            self.per_example["bias"] = [d_beta]

    def _bias(self, records, batch: int) -> None:
        bias = self.layer.bias
        if bias is None or not bias.requires_grad:
            return
        conv = isinstance(self.layer, nn.Conv2d)
        d_out = bias.shape[0]
        self.per_example["bias"] = [_total(g.sum(dim=(2, 3)) if conv else g.reshape(batch, -1, d_out).sum(1)
                                           for _, g in records)]

    def _weight(self, records) -> None:
        layer = self.layer
        conv = isinstance(layer, nn.Conv2d)
        weight = layer.weight
        d_out, d_in = weight.shape[0], weight[0].numel()
        positions = sum(g[0, 0].numel() if conv else g[0].numel() // d_out for _, g in records)
        if positions == 1 and not conv:
            # Linear on (B, D): ‖g_i a_iᵀ‖² = ‖a_i‖²‖g_i‖²; the sum is an mm on pre-scaled g.
            self.a, self.g = records[0][0], records[0][1]
            self.sq_norm = self.sq_norm + _sq_norms(self.a) * _sq_norms(self.g)
            return
        ghost = positions * (d_in + d_out) < d_in * d_out
        if not conv:
            batch = records[0][0].shape[0]
            a_rows = _rows([a for a, _ in records], batch, d_in)     # (B, L, D_in)
            g_rows = _rows([g for _, g in records], batch, d_out)    # (B, L, D_out)
            if ghost:
                # ‖Σ_t g_t a_tᵀ‖_F² = ⟨A Aᵀ, G Gᵀ⟩ over position pairs; the sum is one mm over B·L rows.
                aa = torch.bmm(a_rows, a_rows.transpose(1, 2))
                gg = torch.bmm(g_rows, g_rows.transpose(1, 2))
                self.sq_norm = self.sq_norm + (aa * gg).sum(dim=(1, 2))
                self.a, self.g = a_rows, g_rows
            elif d_out > d_in:
                # Held transposed, (B, D_in, D_out): a batched matmul whose result rows are the longer
                # dimension is several times faster (measured 0.5 against 12 ms for 8 → 1024 over 80
                # positions at batch 10, 1 thread).
                self.per_example["weight"] = [torch.bmm(a_rows.transpose(1, 2), g_rows)]
                self.weight_transposed = True
            else:
                self.per_example["weight"] = [torch.bmm(g_rows.transpose(1, 2), a_rows)]
        elif ghost:
            # Ghost norm ‖g aᵀ‖_F² = ⟨aᵀa, gᵀg⟩ over position pairs.
            seqs = [_conv_sequence(layer, a, g) for a, g in records]
            a_seq = torch.cat([a for a, _ in seqs], dim=2) if len(seqs) > 1 else seqs[0][0]
            g_seq = torch.cat([g for _, g in seqs], dim=2) if len(seqs) > 1 else seqs[0][1]
            aa = torch.bmm(a_seq.transpose(1, 2), a_seq)
            gg = torch.bmm(g_seq.transpose(1, 2), g_seq)
            self.sq_norm = self.sq_norm + (aa * gg).sum(dim=(1, 2))
            # The clipped sum is an ordinary weight gradient with g pre-scaled by the clip factors:
            # oneDNN's weight-grad call on the recorded maps beats contracting the patches.
            self.scaled_records = list(records)
        else:
            self.per_example["weight"] = _conv_per_example_chunks(layer, records, records[0][0].shape[0])
            self.weight_transposed = _uses_im2col(layer)

    def _embedding(self, records, batch: int) -> None:
        layer = self.layer
        if not layer.weight.requires_grad:
            return
        vocab, dim = layer.weight.shape
        tokens = torch.cat([a.reshape(batch, -1) for a, _ in records], dim=1).long()         # (B, L)
        g = _rows([g for _, g in records], batch, dim)                                       # (B, L, D)
        if layer.padding_idx is not None:
            g = g.masked_fill((tokens == layer.padding_idx).unsqueeze(2), 0.0)
        if embedding_uses_ghost_norm(vocab, dim, tokens.shape[1]):
            # Ghost norm: Σ over position pairs holding the same token of ⟨g_it, g_is⟩.
            same = tokens.unsqueeze(2) == tokens.unsqueeze(1)
            sq = (torch.bmm(g, g.transpose(1, 2)) * same).sum(dim=(1, 2))
        else:
            # Each example's (V, D) gradient, scattered from its positions' output gradients.
            per_example = g.new_zeros(batch, vocab, dim).scatter_add_(1, tokens.unsqueeze(2).expand(-1, -1, dim), g)
            sq = _sq_norms(per_example)
        self.sq_norm = self.sq_norm + sq
        self.tokens, self.g = tokens, g

    def clipped_sums(self, factors: torch.Tensor,
                     into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """``{"weight": Σ_i c_i ∇W_i, "bias": Σ_i c_i ∇b_i}`` in the parameters' shapes, for the
        trainable parameters; zeros for a layer that did not influence the loss.

        ``into`` (parameter name → a tensor of that parameter's shape): add each sum to that
        tensor in place and return it, instead of allocating the sum (for a Linear layer on
        (B, D) the matmul accumulates into it directly: one multi-MB pass less per step)."""
        out = {}
        into = into or {}
        for pname, p in self.layer.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            acc = into.get(pname)
            value = None
            if pname == "weight" and self.weight_transposed:
                d_out = p.shape[0]
                transposed = _weighted_sum(factors, self.per_example[pname], (p.numel() // d_out, d_out))
                value = transposed.t().reshape(p.shape)
            elif pname in self.per_example:
                value = _weighted_sum(factors, self.per_example[pname], p.shape)
            elif pname == "weight" and self.scaled_records is not None:
                value = _total(_conv_weight_grad(self.layer, a, g * factors.view(-1, 1, 1, 1))
                               for a, g in self.scaled_records)
            elif pname == "weight" and self.tokens is not None:
                rows = (self.g * factors.view(-1, 1, 1)).reshape(-1, p.shape[1])
                target = acc if acc is not None else torch.zeros_like(p)
                out[pname] = target.index_add_(0, self.tokens.reshape(-1), rows)
                continue
            elif pname == "weight" and self.a is not None:
                scaled = self.g * factors.view(-1, *([1] * (self.g.dim() - 1)))
                a_rows, g_rows = self.a.reshape(-1, self.a.shape[-1]), scaled.reshape(-1, scaled.shape[-1])
                if acc is not None:
                    out[pname] = acc.addmm_(g_rows.t(), a_rows)     # one mm over B·L rows, straight into acc
                    continue
                value = torch.mm(g_rows.t(), a_rows)
            if acc is not None:
                out[pname] = acc if value is None else acc.add_(value)
            else:
                out[pname] = torch.zeros_like(p) if value is None else value
        return out
