"""Server-side clipping-threshold rules, framework-free: ADPC, Andrew et al. 2021 quantile
clipping and AWDP-FL per-layer weights (docs/methods.md).

Privacy: ADPC and the AWDP-FL weights only post-process uploaded model deltas, which are already DP
outputs, so they cost nothing. Quantile clipping reads the *raw* clipped-or-not bits of each client; its
release is private only through the noise added in :func:`noised_fraction_below`, which the caller must
compose into the ledger.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "median", "adpc_next_clip", "histogram_edges", "example_norm_histogram", "histogram_quantile",
    "pooled_histogram_quantile", "normalized_lr_scale",
    "norm_quantile", "update_norm_per_step", "denoise_update_norm",
    "quantile_clip_update", "noised_fraction_below", "awdp_layer_weights",
]

from raysim.algorithms.cra_math import _as_vector as _finite_vector  # one validation helper
from raysim.config import CLIPPING_MODES



def median(values: np.ndarray) -> float:
    """Median; for an even count, the mean of the two middle values (ADPC)."""
    arr = np.sort(_finite_vector(values, "values"))
    mid = arr.size // 2
    if arr.size % 2:
        return float(arr[mid])
    return float(0.5 * (arr[mid - 1] + arr[mid]))


def adpc_next_clip(update_norms: np.ndarray, clip_norm: float, *, c_min: float = 0.1,
                   smoothing: float = 1.0) -> float:
    """ADPC threshold for the next round (docs/methods.md, "FedDimDP").

    C* = max(median_i s_i, C_min), then C^(t+1) = (1 − γ)·C^(t) + γ·C* with γ = ``smoothing``
    (γ = 1: no smoothing, the paper's literal rule). C_min = 0.1 is (R). ``update_norms`` are the s_i
    (or the denoised ŝ_i) in the same unit as C; choosing that unit is the caller's (R) option.
    """
    if clip_norm <= 0.0 or c_min <= 0.0:
        raise ValueError(f"clip_norm and c_min must be > 0, got {clip_norm}, {c_min}")
    if not 0.0 < smoothing <= 1.0:
        raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
    target = max(median(update_norms), c_min)   # update_norms: the S^(t) of the configured statistic
    return float((1.0 - smoothing) * clip_norm + smoothing * target)


def histogram_edges(num_bins: int, lo: float, hi: float) -> np.ndarray:
    """The ``num_bins + 1`` log-spaced edges of ADPC's norm histogram on [lo, hi] (fixed by config, never
    by data). The histogram itself has ``num_bins + 2`` cells: underflow [0, lo), the bins, overflow [hi, ∞)."""
    if num_bins < 1 or not 0.0 < lo < hi:
        raise ValueError(f"need num_bins >= 1 and 0 < lo < hi, got {num_bins}, {lo}, {hi}")
    return np.geomspace(lo, hi, num_bins + 1)


def example_norm_histogram(norms: np.ndarray | None, edges: np.ndarray) -> np.ndarray:
    """ADPC's per-client histogram of pre-clipping per-example gradient norms, *before* noise.

    ``norms`` holds one norm per example of the client (the pre-round norm pass at the round's starting
    model, :func:`raysim.training.example_norm_pass`); each adds 1 to its cell. Adding or removing one
    example changes one cell by 1: sensitivity 1 in L1 and in L2. ``None`` (no norms) gives all zeros.
    Cells: underflow [0, edges[0]), the len(edges) − 1 bins (a norm equal to an inner edge goes to the
    upper bin), overflow [edges[-1], ∞).
    """
    arr = np.zeros(0) if norms is None else np.asarray(norms, dtype=np.float64).ravel()
    cells = np.searchsorted(edges, arr, side="right")   # 0: underflow, len(edges): overflow
    return np.bincount(cells, minlength=len(edges) + 1).astype(np.float64)


def histogram_quantile(counts: np.ndarray, edges: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of a (noisy) ADPC histogram: negative cells clamped to 0, cumulative sum,
    log-linear interpolation inside the bin. A quantile in the underflow cell reads as
    ``edges[0]``, in the overflow cell as ``edges[-1]``; an all-zero histogram gives NaN (no information)."""
    c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
    if c.shape != (len(edges) + 1,):
        raise ValueError(f"expected {len(edges) + 1} cells, got {c.shape}")
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    total = float(c.sum())
    if total <= 0.0:
        return float("nan")
    target = quantile * total
    cum = np.cumsum(c)
    cell = int(np.searchsorted(cum, target, side="left"))
    if cell == 0:
        return float(edges[0])
    if cell >= len(edges):
        return float(edges[-1])
    before = cum[cell - 1]
    frac = (target - before) / c[cell] if c[cell] > 0 else 0.0
    lo, hi = math.log(edges[cell - 1]), math.log(edges[cell])
    return float(math.exp(lo + frac * (hi - lo)))


def pooled_histogram_quantile(histograms: list[np.ndarray], edges: np.ndarray, quantile: float) -> float:
    """ADPC's ``adpc.read=pooled`` (R): the ``quantile`` of the cohort's noised histograms summed cell by
    cell, read by :func:`histogram_quantile` (clamping only the sum, so the clients' zero-mean noise can
    cancel). With N clients of m examples each and noise σ_h per cell, the pooled signal is N·m and the
    pooled noise σ_h·√N per cell. Post-processing of the same releases: no extra privacy cost."""
    if not histograms:
        raise ValueError("need at least one histogram")
    stacked = np.stack([np.asarray(h, dtype=np.float64) for h in histograms])
    return histogram_quantile(stacked.sum(axis=0), edges, quantile)


def normalized_lr_scale(c0: float, clip_norm: float) -> float:
    """ADPC's ``adpc.step=normalized`` (R): the local lr factor C^(0)/C^(t). A clipped per-example gradient
    has norm ≤ C^(t), so the step's largest size stays that of C^(0) and ADPC moves only what is clipped
    and the noise scale, not the step (compare automatic clipping, Bu et al. 2023). Public values only."""
    if c0 <= 0.0 or clip_norm <= 0.0:
        raise ValueError(f"c0 and clip_norm must be > 0, got {c0}, {clip_norm}")
    return float(c0 / clip_norm)


def norm_quantile(norms: np.ndarray | None, quantile: float) -> float:
    """The exact ``quantile`` of a client's per-example norms (the lower order statistic: the true value
    the private histogram estimates; a simulation diagnostic, never uploaded). NaN if there are none."""
    arr = np.zeros(0) if norms is None else np.sort(np.asarray(norms, dtype=np.float64).ravel())
    if arr.size == 0:
        return float("nan")
    pos = int(np.searchsorted(np.arange(1, arr.size + 1), quantile * arr.size, side="left"))
    return float(arr[min(pos, arr.size - 1)])


def update_norm_per_step(delta_norm: float, lr: float, num_steps: int) -> float:
    """s_i = ‖Δw_i‖ / (η_l·τ_i): the update norm as the mean per-step gradient norm, in C's units (R)."""
    if delta_norm < 0.0 or lr <= 0.0 or num_steps < 1:
        raise ValueError(f"need delta_norm >= 0, lr > 0, num_steps >= 1; got {delta_norm}, {lr}, {num_steps}")
    return float(delta_norm / (lr * num_steps))


def denoise_update_norm(s: float, *, num_params: int, noise_multiplier: float, clip_norm: float,
                        expected_batch_size: float, num_steps: int, mode: str) -> float:
    """Remove the known DP-noise energy from a per-step update norm (ADPC, ``adpc.statistic=update_norm_denoised``, R).

    With plain local SGD, s = ‖mean of τ noisy steps‖ has E[s²] = ‖ḡ‖² + noise energy, where the noise
    energy is d·σ²C²/(B²·τ) for ``per_sample`` (noise N(0, σ²C²I) on a sum divided by B) and d·σ²C²/τ
    for ``batch`` (noise on the clipped mean). Returns ŝ = sqrt(max(s² − energy, 0)); ``none`` returns s.
    ``s`` must be in per-step units (:func:`update_norm_per_step`); the formula does not hold for raw ‖Δw‖.
    Pure post-processing of DP outputs, so free in privacy.
    """
    if mode not in CLIPPING_MODES:
        raise ValueError(f"mode must be one of {CLIPPING_MODES}, got {mode!r}")
    if s < 0.0:
        raise ValueError(f"s must be >= 0, got {s}")
    if mode == "none":
        return float(s)
    if num_params < 1 or num_steps < 1 or noise_multiplier < 0.0 or clip_norm <= 0.0:
        raise ValueError("need num_params >= 1, num_steps >= 1, noise_multiplier >= 0, clip_norm > 0")
    energy = num_params * noise_multiplier**2 * clip_norm**2 / num_steps
    if mode == "per_sample":
        if expected_batch_size <= 0.0:
            raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
        energy /= expected_batch_size**2
    return float(math.sqrt(max(s * s - energy, 0.0)))


def quantile_clip_update(clip_norm: float, clipped_fraction_noisy: float, *, eta_c: float = 0.2,
                         target_quantile: float = 0.5) -> float:
    """Andrew et al. 2021 geometric update: C ← C·exp(−η_c·(b̄ − γ)).

    ``clipped_fraction_noisy`` is b̄, the noised fraction of clients with ‖Δ_i‖ ≤ C (despite the name it
    counts the *unclipped* ones, as in the paper); it may fall outside [0, 1] because of the noise.
    """
    if clip_norm <= 0.0 or eta_c < 0.0:
        raise ValueError(f"need clip_norm > 0 and eta_c >= 0, got {clip_norm}, {eta_c}")
    if not 0.0 <= target_quantile <= 1.0:
        raise ValueError(f"target_quantile must be in [0, 1], got {target_quantile}")
    if not math.isfinite(clipped_fraction_noisy):
        raise ValueError(f"clipped_fraction_noisy must be finite, got {clipped_fraction_noisy}")
    return float(clip_norm * math.exp(-eta_c * (clipped_fraction_noisy - target_quantile)))


def noised_fraction_below(norms: np.ndarray, clip_norm: float, noise_std: float,
                          rng: np.random.Generator) -> float:
    """b̄ = (Σ_i 1[‖Δ_i‖ ≤ C] + N(0, noise_std²)) / n (Andrew et al. 2021).

    Each client contributes one bit, so the count has sensitivity 1; the Gaussian release is the private
    part, and its cost is the caller's to account. One standard normal is always drawn from ``rng``, so
    the stream advances identically whether or not the noise is switched off.
    """
    arr = _finite_vector(norms, "norms")
    if noise_std < 0.0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    count = float(np.count_nonzero(arr <= clip_norm))
    noise = noise_std * float(rng.standard_normal())
    return (count + noise) / arr.size


def awdp_layer_weights(norm_ema: np.ndarray) -> np.ndarray:
    """AWDP-FL per-layer weights (R): w_k ∝ EMA of layer k's norm, scaled so Σ_k w_k² = 1.

    Thresholds C_k = C·w_k then keep the total sensitivity at C. An all-zero EMA gives uniform 1/√K.
    """
    arr = _finite_vector(norm_ema, "norm_ema")
    if np.any(arr < 0.0):
        raise ValueError(f"norm_ema must be >= 0, got {arr}")
    largest = float(arr.max()) if arr.size else 0.0
    if largest == 0.0:
        return np.full(arr.size, 1.0 / math.sqrt(arr.size))
    # Scale by the largest entry first: squaring a norm near 1e-160 underflows to a subnormal,
    # and Σ w_k² came out as 1 + 5e-9 (hypothesis found it).
    scaled = arr / largest
    return scaled / float(np.linalg.norm(scaled))
