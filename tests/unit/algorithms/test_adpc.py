"""ADPC (docs/methods.md): the private per-example-norm histogram, and why the literal update-norm rules fail."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysim.algorithms.clip_rules import (
    adpc_next_clip, denoise_update_norm, example_norm_histogram, histogram_edges, histogram_quantile,
    norm_quantile, update_norm_per_step,
)
from raysim.algorithms.registry import get_method
from raysim.config import config_from_dict
from raysim.privacy.plan import not_covered, plan_noise, side_channels

EDGES = histogram_edges(48, 1e-3, 1e3)


# --------------------------------------------------------------------------- the histogram

@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(0, 2**31 - 1), st.integers(0, 39))
def test_one_example_moves_the_histogram_by_exactly_one_in_l1_and_l2(n, seed, victim):
    """Add/remove one example: the pre-round pass has one norm per example, so one cell moves by 1."""
    norms = np.exp(np.random.default_rng(seed).normal(0.0, 3.0, n))   # many bins, some out of range
    victim = victim % n
    diff = example_norm_histogram(norms, EDGES) - example_norm_histogram(np.delete(norms, victim), EDGES)
    assert np.abs(diff).sum() == 1.0 and np.linalg.norm(diff) == 1.0 and diff.min() == 0.0


def test_cells_cover_underflow_and_overflow():
    h = example_norm_histogram(np.array([1e-5, 1e-3, 1.0, 5e3]), EDGES)
    assert h.shape == (50,) and h[0] == 1 and h[-1] == 1 and h.sum() == 4   # 1e-3 is the first bin's lower edge
    assert example_norm_histogram(None, EDGES).sum() == 0


@pytest.mark.parametrize("seed", range(5))
def test_median_of_a_noiseless_histogram_is_within_one_bin_of_numpys(seed):
    rng = np.random.default_rng(seed)
    norms = np.exp(rng.normal(rng.uniform(-3, 3), 1.0, 501))
    counts = example_norm_histogram(norms, EDGES)
    got = histogram_quantile(counts, EDGES, 0.5)
    bin_width = math.log(EDGES[1] / EDGES[0])
    assert abs(math.log(got) - math.log(np.median(norms))) <= bin_width
    assert norm_quantile(norms, 0.5) == pytest.approx(np.median(norms))
    assert norm_quantile(np.array([3.0, 1.0, 2.0, 4.0]), 0.5) == 2.0 and math.isnan(norm_quantile(None, 0.5))


def test_quantile_reading_clamps_negative_cells_and_handles_the_edges():
    counts = np.zeros(50)
    counts[10] = 4.0
    counts[30] = -100.0            # negative noise does not pull the quantile
    lo, hi = EDGES[9], EDGES[10]
    assert histogram_quantile(counts, EDGES, 0.5) == pytest.approx(math.exp((math.log(lo) + math.log(hi)) / 2))
    assert math.isnan(histogram_quantile(-np.ones(50), EDGES, 0.5))
    under, over = np.zeros(50), np.zeros(50)
    under[0], over[-1] = 1.0, 1.0
    assert histogram_quantile(under, EDGES, 0.5) == EDGES[0] and histogram_quantile(over, EDGES, 0.5) == EDGES[-1]


# --------------------------------------------------------------------------- privacy of the release

def _cfg(**kw):
    values = {"method": "feddimdp", "rounds": 20, "privacy": {"epsilon": 8.0}}
    values.update(kw)
    return config_from_dict(values)


def test_epsilon_including_the_release_stays_within_target():
    cfg = _cfg(rounds=3)
    spec = get_method("feddimdp")
    q, steps = np.array([0.05, 0.2]), np.array([20, 5])
    sigmas = plan_noise(spec, cfg, "per_sample", q, steps)
    sigma_h = cfg.adpc.histogram_noise_multiplier
    no_release = plan_noise(spec, _cfg(rounds=3, feddimdp={"adpc": False}), "per_sample", q, steps)
    assert (sigmas > no_release).all()          # the histogram's cost is paid by DP-SGD's σ
    for qi, si, sigma in zip(q, steps, sigmas):
        # Composed independently of raysim's event merging: every step and every release, one by one.
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        for _ in range(cfg.rounds):
            acc.compose(dp_accounting.PoissonSampledDpEvent(qi, dp_accounting.GaussianDpEvent(sigma)), int(si))
            acc.compose(dp_accounting.GaussianDpEvent(sigma_h))
        assert acc.get_epsilon(cfg.privacy.delta) <= cfg.privacy.epsilon * 1.002   # PLD discretisation slack


def test_the_histogram_is_a_declared_release_not_an_uncovered_upload():
    spec, cfg = get_method("feddimdp"), _cfg()
    # CRA's q_i is noised by default too (cra.private_val_f1), so both are Gaussian releases
    assert [(c.name, c.noise_multiplier) for c in side_channels(spec, cfg)] == [("norm_histogram", 25.0), ("val_f1", 20.0)]
    text = not_covered(spec, cfg, "per_sample")
    assert "norm_histogram" not in text and "histogram" not in text.split("never uploaded")[0]
    assert text.startswith("logged by the simulation only") and "val_f1" not in text


# --------------------------------------------------------------------------- the literal rules fail

def _round_updates(rng, clip, *, d, steps, batch, sigma, lr, true_norm, shared=0.0):
    """Δw of one client's round of DP-SGD with per-example gradients of norm ``true_norm`` ≫ C in random
    directions (plus an optional shared direction), all clipped to C, noise N(0, σ²C²I) per step."""
    delta = np.zeros(d)
    common = rng.normal(size=d)
    common /= np.linalg.norm(common)
    for _ in range(steps):
        g = rng.normal(size=(batch, d))
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        g = shared * common + (1 - shared) * g
        g *= true_norm / np.linalg.norm(g, axis=1, keepdims=True)
        clipped = g * np.minimum(1.0, clip / np.linalg.norm(g, axis=1, keepdims=True))
        noisy = (clipped.sum(0) + rng.normal(0.0, sigma * clip, d)) / batch
        delta -= lr * noisy
    return delta


def test_denoised_rule_cannot_exceed_c_so_it_never_reaches_the_gradient_scale():
    # ŝ_i is the norm of an average of vectors of norm ≤ C: even with gradients 10× C, C only shrinks.
    rng = np.random.default_rng(0)
    d, steps, batch, sigma, lr, true_norm = 500, 8, 32, 1.0, 0.1, 10.0
    clip = 1.0
    for _ in range(6):
        s_hat = [denoise_update_norm(update_norm_per_step(np.linalg.norm(
                     _round_updates(rng, clip, d=d, steps=steps, batch=batch, sigma=sigma, lr=lr, true_norm=true_norm,
                                    shared=0.3)), lr, steps),
                 num_params=d, noise_multiplier=sigma, clip_norm=clip, expected_batch_size=batch, num_steps=steps,
                 mode="per_sample") for _ in range(5)]
        new = adpc_next_clip(np.array(s_hat), clip, c_min=0.1)
        assert new <= clip * 1.05          # never grows beyond noise in the energy estimate
        clip = new
    assert clip < 0.6 and clip < true_norm / 10


@pytest.mark.parametrize("statistic", ["update_norm", "update_norm_per_step"])
def test_raw_rules_multiply_c_by_a_constant_fixed_by_the_hyperparameters(statistic):
    # Noise dominates Δw_i and scales with C, so C^(t+1)/C^(t) is a constant κ: above 1 C explodes,
    # below 1 it collapses, whatever the gradients are.
    rng = np.random.default_rng(1)
    d, steps, batch, sigma, lr = 2000, 10, 16, 1.0, 0.5

    def next_over_current(clip: float) -> float:
        s = []
        for _ in range(5):
            norm = np.linalg.norm(_round_updates(rng, clip, d=d, steps=steps, batch=batch, sigma=sigma, lr=lr,
                                                 true_norm=50.0))
            s.append(norm if statistic == "update_norm" else update_norm_per_step(norm, lr, steps))
        return adpc_next_clip(np.array(s), clip, c_min=1e-9) / clip

    ratios = [next_over_current(c) for c in (0.1, 1.0, 10.0)]
    assert max(ratios) / min(ratios) < 1.1                      # the same κ at every scale of C
    # ...and κ is the noise formula: η·√τ·σ·√d/B (raw) or σ·√d/(B·√τ) (per step), up to the clipped signal.
    kappa = lr * math.sqrt(steps) * sigma * math.sqrt(d) / batch
    if statistic == "update_norm_per_step":
        kappa /= lr * steps
    assert np.mean(ratios) == pytest.approx(kappa, rel=0.15)
    assert kappa > 1 if statistic == "update_norm" else kappa < 1   # explodes / collapses geometrically
