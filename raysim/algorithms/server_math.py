"""Pure server-side maths of FedDimDP and its baselines, on float64 numpy arrays.

This module is the one import point: CRA lives in :mod:`raysim.algorithms.cra_math`, the clipping-
threshold rules in :mod:`raysim.algorithms.clip_rules`, and the momentum / control-variate / schedule
rules of the baselines (FedACG, SCAFFOLD, DP-ACDN) are defined here. Nothing here touches torch or Ray;
callers flatten models to vectors.
"""

from __future__ import annotations

import numpy as np

from raysim.algorithms.clip_rules import (
    adpc_next_clip,
    awdp_layer_weights,
    denoise_update_norm,
    median,
    noised_fraction_below,
    quantile_clip_update,
    update_norm_per_step,
)
from raysim.algorithms.cra_math import CRAResult, cra_weights, ema, project_capped_simplex

__all__ = [
    "project_capped_simplex", "ema", "CRAResult", "cra_weights",
    "median", "adpc_next_clip", "update_norm_per_step", "denoise_update_norm",
    "quantile_clip_update", "noised_fraction_below", "awdp_layer_weights",
    "fedacg_server_update", "fedacg_lookahead", "scaffold_control_update", "decaying_sigma_schedule",
]


def _momentum_or_zeros(momentum: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    if momentum is None:
        return np.zeros_like(like)
    momentum = np.asarray(momentum, dtype=np.float64)
    if momentum.shape != like.shape:
        raise ValueError(f"momentum has shape {momentum.shape}, model has shape {like.shape}")
    return momentum


def fedacg_lookahead(global_w: np.ndarray, momentum: np.ndarray | None, lam: float = 0.85) -> np.ndarray:
    """FedACG broadcast point w̃ = w + λ·m^(t−1) (Kim et al. 2024); ``momentum=None`` means m = 0."""
    w = np.asarray(global_w, dtype=np.float64)
    return w + lam * _momentum_or_zeros(momentum, w)


def fedacg_server_update(global_w: np.ndarray, momentum: np.ndarray | None, mean_delta: np.ndarray,
                         lam: float = 0.85) -> tuple[np.ndarray, np.ndarray]:
    """FedACG server step: m^(t) = λ·m^(t−1) + mean_i Δ_i, w^(t+1) = w^(t) + m^(t).

    Δ_i is measured from the look-ahead w̃ the clients started from (Δ_i = w_i − w̃), so w^(t+1) equals
    the mean client model. Returns (new_global, new_momentum); ``momentum=None`` means m^(−1) = 0.
    """
    w = np.asarray(global_w, dtype=np.float64)
    delta = np.asarray(mean_delta, dtype=np.float64)
    if delta.shape != w.shape:
        raise ValueError(f"mean_delta has shape {delta.shape}, model has shape {w.shape}")
    new_momentum = lam * _momentum_or_zeros(momentum, w) + delta
    return w + new_momentum, new_momentum


def scaffold_control_update(c_i: np.ndarray, c: np.ndarray, global_w: np.ndarray, local_w: np.ndarray,
                            lr: float, num_steps: int) -> np.ndarray:
    """SCAFFOLD client control variate, option II of Karimireddy et al. 2020.

    c_i⁺ = c_i − c + (x − y_i) / (K·η_l), with x the global model the client started from, y_i its model
    after K local steps of size η_l. Computed from the client's own (DP-trained) model: post-processing.
    """
    if lr <= 0.0 or num_steps < 1:
        raise ValueError(f"need lr > 0 and num_steps >= 1, got {lr}, {num_steps}")
    arrays = [np.asarray(a, dtype=np.float64) for a in (c_i, c, global_w, local_w)]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"c_i, c, global_w, local_w must share a shape, got {[a.shape for a in arrays]}")
    c_i, c, x, y = arrays
    return c_i - c + (x - y) / (num_steps * lr)


def decaying_sigma_schedule(num_rounds: int, gamma: float) -> np.ndarray:
    """DP-ACDN relative noise multipliers [γ^t for t = 0..T−1] (R, docs/methods.md); σ_t = σ_0·γ^t.

    σ_0 is calibrated elsewhere (through the accountant) so that the whole run ends at the target ε.
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    return gamma ** np.arange(num_rounds, dtype=np.float64)
