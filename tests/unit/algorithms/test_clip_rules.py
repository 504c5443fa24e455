"""Clipping-threshold rules: ADPC, denoising, Andrew et al. quantile clipping, AWDP-FL weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysim.algorithms.clip_rules import (
    adpc_next_clip,
    awdp_layer_weights,
    denoise_update_norm,
    median,
    noised_fraction_below,
    quantile_clip_update,
    update_norm_per_step,
)


def test_median_odd_and_even():
    assert median(np.array([3.0, 1.0, 2.0])) == 2.0
    assert median(np.array([4.0, 1.0, 3.0, 2.0])) == 2.5
    assert median(np.array([7.0])) == 7.0
    with pytest.raises(ValueError):
        median(np.array([]))


def test_adpc_floor_and_smoothing():
    # median 0.02 < C_min = 0.1 -> floor.
    assert adpc_next_clip(np.array([0.01, 0.02, 0.05]), 1.0) == pytest.approx(0.1)
    # median of [2, 4, 6, 8] = 5; no smoothing -> 5.
    assert adpc_next_clip(np.array([8.0, 2.0, 6.0, 4.0]), 1.0) == pytest.approx(5.0)
    # smoothing 0.5: 0.5 * 1 + 0.5 * 5 = 3.
    assert adpc_next_clip(np.array([8.0, 2.0, 6.0, 4.0]), 1.0, smoothing=0.5) == pytest.approx(3.0)
    # floor applies before smoothing: 0.75 * 2 + 0.25 * max(0.02, 0.5) = 1.625.
    assert adpc_next_clip(np.array([0.02]), 2.0, c_min=0.5, smoothing=0.25) == pytest.approx(1.625)
    with pytest.raises(ValueError):
        adpc_next_clip(np.array([1.0]), 1.0, smoothing=0.0)
    with pytest.raises(ValueError):
        adpc_next_clip(np.array([1.0]), 1.0, c_min=0.0)


def test_update_norm_per_step():
    assert update_norm_per_step(0.7, 0.01, 70) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        update_norm_per_step(1.0, 0.0, 10)


def test_denoise_per_sample_batch_none_and_clamp():
    # per_sample: d sigma^2 C^2 / (B^2 tau) = 1000 * 1 * 4 / (100 * 4) = 10; sqrt(25 - 10) = sqrt(15).
    kw = dict(num_params=1000, noise_multiplier=1.0, clip_norm=2.0, expected_batch_size=10.0, num_steps=4)
    assert denoise_update_norm(5.0, mode="per_sample", **kw) == pytest.approx(math.sqrt(15.0))
    # Clamp: 3^2 - 10 < 0 -> 0.
    assert denoise_update_norm(3.0, mode="per_sample", **kw) == 0.0
    # batch: d sigma^2 C^2 / tau = 10 * 0.25 * 4 / 5 = 2; sqrt(4 - 2) = sqrt(2). B is irrelevant.
    kw_b = dict(num_params=10, noise_multiplier=0.5, clip_norm=2.0, expected_batch_size=123.0, num_steps=5)
    assert denoise_update_norm(2.0, mode="batch", **kw_b) == pytest.approx(math.sqrt(2.0))
    assert denoise_update_norm(2.0, mode="none", **kw_b) == 2.0
    with pytest.raises(ValueError):
        denoise_update_norm(2.0, mode="per_example", **kw_b)


def test_quantile_clip_update_hand_computed():
    # 2 * exp(-0.2 * (0.8 - 0.5)) = 2 * exp(-0.06) = 2 * 0.9417645335842487
    assert quantile_clip_update(2.0, 0.8) == pytest.approx(1.8835290671684974, rel=1e-12)
    # b < gamma -> C grows: 1 * exp(-0.5 * (0.0 - 0.9)) = exp(0.45) = 1.5683121854901688
    assert quantile_clip_update(1.0, 0.0, eta_c=0.5, target_quantile=0.9) == pytest.approx(1.5683121854901688)
    assert quantile_clip_update(3.0, 0.5) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        quantile_clip_update(0.0, 0.5)


def test_noised_fraction_below():
    norms = np.array([0.5, 1.0, 1.5, 2.0])
    # <= is inclusive: 0.5 and 1.0 count.
    assert noised_fraction_below(norms, 1.0, 0.0, np.random.default_rng(0)) == 0.5
    got = noised_fraction_below(norms, 1.0, 3.0, np.random.default_rng(7))
    expected = (2.0 + 3.0 * np.random.default_rng(7).standard_normal()) / 4
    assert got == pytest.approx(expected, rel=1e-12)
    assert got != 0.5
    with pytest.raises(ValueError):
        noised_fraction_below(norms, 1.0, -1.0, np.random.default_rng(0))


def test_awdp_weights_hand_and_degenerate():
    np.testing.assert_allclose(awdp_layer_weights(np.array([3.0, 4.0])), [0.6, 0.8])
    np.testing.assert_allclose(awdp_layer_weights(np.zeros(4)), [0.5] * 4)
    with pytest.raises(ValueError):
        awdp_layer_weights(np.array([1.0, -1.0]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e3), min_size=1, max_size=12))
def test_awdp_weights_unit_norm_and_proportional(values):
    ema_norms = np.array(values)
    w = awdp_layer_weights(ema_norms)
    assert np.sum(w**2) == pytest.approx(1.0, rel=1e-12)
    if ema_norms.any():
        np.testing.assert_allclose(w * np.linalg.norm(ema_norms), ema_norms, rtol=1e-12, atol=1e-12)


def test_awdp_weights_of_tiny_norms_stay_on_the_unit_sphere():
    """Norms whose squares underflow to subnormals (the case hypothesis found in CI)."""
    for values in ([6.881204475600867e-159], [1e-300, 2e-300], [5e-324, 1.0]):
        w = awdp_layer_weights(np.array(values))
        assert np.sum(w**2) == pytest.approx(1.0, rel=1e-12)
