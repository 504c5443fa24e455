"""Correlated-noise mechanisms: the mathematics of matrix factorisations for streaming DP releases.

A matrix mechanism adds to step t's clipped sum the noise ``σ · sens(C) · C_clip · (C⁻¹ z)_t``, z i.i.d.
N(0, I): the released prefix sums are then those of the Gaussian mechanism ``C x + z`` of multiplier σ on
the strategy ``C``, post-processed. ``C = I`` is independent Gaussian noise.

* :mod:`~raysim.privacy.mechanisms.toeplitz`: Toeplitz algebra, errors, min-separation sensitivity.
* :mod:`~raysim.privacy.mechanisms.blt`: Buffered Linear Toeplitz strategies (optimised, streamed).
* :mod:`~raysim.privacy.mechanisms.bandmf`: banded strategies, streamed, and amplified accounting.
* :mod:`~raysim.privacy.mechanisms.base`, :mod:`~raysim.privacy.mechanisms.registry`,
  :mod:`~raysim.privacy.mechanisms.builtin`: the client-level mechanisms (``privacy.mechanism``) as
  registered objects, and the built-in ones (gaussian, tree, blt, bandmf).

Each streaming noise object (:class:`~raysim.privacy.mechanisms.blt.BLTNoise`,
:class:`~raysim.privacy.mechanisms.bandmf.BandMFNoise`) follows :class:`StreamingNoise`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:   # the package imports no torch: the config validates against its registry
    import torch

__all__ = ["StreamingNoise"]


class StreamingNoise(Protocol):
    """``(C⁻¹ z)_t`` one step at a time, from the caller's i.i.d. draws ``z_t``; its state checkpoints."""

    def step(self, z: torch.Tensor) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
