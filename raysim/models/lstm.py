"""The character LSTM of McMahan et al. 2017 (LEAF's Shakespeare model), built from ``nn.Linear`` layers.

``Embedding(V, 8) → LSTM(8 → 256) → LSTM(256 → 256) → Linear(256 → V)`` on the last position: the
logits of the character that follows a window of T characters (T = 80 in LEAF's task).

Each LSTM layer is two ``nn.Linear`` layers and PyTorch's ``nn.LSTM`` cell arithmetic (gate order
i, f, g, o; ``c' = σ(f)·c + σ(i)·tanh(g)``, ``h' = σ(o)·tanh(c')``, ``h_0 = c_0 = 0``), like Opacus's
``DPLSTM``, so that raysim's per-example engine covers it with its Linear and Embedding rules:

- ``ih`` (input → 4H, with the layer's one bias) is applied to the whole sequence (B, T, D) in one
  call; ``hh`` (H → 4H, no bias: a second bias, as ``nn.LSTM``'s ``b_hh``, would only duplicate
  ``ih``'s) is called once per step, T − 1 times (``h_0 = 0``, so step 0 has no recurrent term), and
  the engine sums its per-example gradients over the calls.
- Initialisation (:meth:`LSTMLayer.init_from`): every weight and the bias uniform in ±1/√H as
  ``nn.LSTM``'s, then the forget gate's bias set to 1 (Gers et al. 2000; Jozefowicz et al. 2015), the
  default of the TensorFlow and Keras LSTM cells the published Shakespeare baselines were trained with,
  so that early in training the cell keeps its state instead of halving it at every step. The embedding
  is N(0, 1) (``nn.Embedding``'s default), the output layer PyTorch's Linear default.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["LSTMLayer", "CharLSTM", "char_lstm", "FORGET_BIAS"]

#: Initial bias of every LSTM layer's forget gate.
FORGET_BIAS = 1.0


def _under_transform(x: torch.Tensor) -> bool:
    """Whether ``x`` is a tensor inside a ``torch.func`` transform (the ``vmap`` reference engine's
    ``vmap(grad(·))``), where the fused LSTM kernel has no batching rule (torch 2.14 exposes the test only
    in ``torch._C._functorch``)."""
    return bool(torch._C._functorch.is_functorch_wrapped_tensor(x))


class LSTMLayer(nn.Module):
    """One LSTM layer over a sequence: (B, T, D) → (B, T, H) of hidden states, zero initial state."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.ih = nn.Linear(input_size, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden, bias=False)
        # The fused kernel's module (:meth:`_fused`), kept out of the submodules: its own weights are never used.
        self.__dict__["_kernel"] = nn.LSTM(input_size, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.ih._forward_hooks or self.hh._forward_hooks or _under_transform(x)):
            return self._fused(x)
        # The input projection of every step in one call, split with unbind: its backward is one stack,
        # where indexing pre[:, t] would backpropagate a zero-filled (B, T, 4H) tensor at every step.
        pre = self.ih(x).unbind(1)
        h = c = None
        states = []
        for step in pre:
            gates = step if h is None else step + self.hh(h)
            i, f, g, o = gates.chunk(4, dim=1)
            i, f, o, g = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o), torch.tanh(g)
            c = i * g if c is None else f * c + i * g
            h = o * torch.tanh(c)
            states.append(h)
        return torch.stack(states, dim=1)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same layer through PyTorch's fused LSTM kernel, with these weights (``b_hh = 0``): the
        path for plain training and evaluation, 1.7 to 2.3 times faster than the cells one by one at
        batch 10 (a forward and backward pass of the whole model: 0.30-0.36 s against 0.51-0.77 s on one
        thread, 2-core AMD EPYC VM under load from other processes), equal to them within float rounding
        (3e-8 on the logits). The per-example engine, which hooks ``ih`` and ``hh`` to record each call,
        and the ``vmap`` reference engine get the cells one by one."""
        params = {"weight_ih_l0": self.ih.weight, "weight_hh_l0": self.hh.weight, "bias_ih_l0": self.ih.bias,
                  "bias_hh_l0": torch.zeros_like(self.ih.bias)}
        return functional_call(self.__dict__["_kernel"], params, (x,))[0]

    @torch.no_grad()
    def init_from(self, generator: torch.Generator) -> None:
        """``nn.LSTM``'s U(±1/√H) for both weights and the bias, then the forget gate's bias ``FORGET_BIAS``."""
        bound = 1.0 / math.sqrt(self.hidden)
        for p in (self.ih.weight, self.ih.bias, self.hh.weight):
            p.uniform_(-bound, bound, generator=generator)
        self.ih.bias[self.hidden:2 * self.hidden] = FORGET_BIAS


class CharLSTM(nn.Module):
    """Next-character model: token ids (B, T) int64 in [0, vocab_size) → logits (B, vocab_size)."""

    def __init__(self, vocab_size: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        if vocab_size < 2 or embed_dim < 1 or hidden < 1 or layers < 1:
            raise ValueError(f"CharLSTM needs vocab_size >= 2 and embed_dim, hidden, layers >= 1, got "
                             f"{vocab_size}, {embed_dim}, {hidden}, {layers}")
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.ModuleList(LSTMLayer(embed_dim if k == 0 else hidden, hidden) for k in range(layers))
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.is_floating_point() or tokens.is_complex():
            raise ValueError(f"CharLSTM takes integer token ids of shape (B, T), got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        x = self.embed(tokens)
        for layer in self.lstm:
            x = layer(x)
        return self.head(x[:, -1])


def char_lstm(in_channels: int, image_size: int, num_classes: int) -> CharLSTM:
    """The model registry's builder: ``num_classes`` is the vocabulary; ``in_channels`` and ``image_size``
    (an image data set's shape) do not apply."""
    del in_channels, image_size
    return CharLSTM(num_classes)
