"""Baseline server rules (FedACG, SCAFFOLD, DP-ACDN) and the server_math facade."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.algorithms import server_math
from raysim.algorithms.server_math import (
    decaying_sigma_schedule,
    fedacg_lookahead,
    fedacg_server_update,
    scaffold_control_update,
)


def test_facade_exports_the_whole_api():
    for name in ["project_capped_simplex", "ema", "CRAResult", "cra_weights", "median", "adpc_next_clip",
                 "update_norm_per_step", "denoise_update_norm", "quantile_clip_update", "noised_fraction_below",
                 "awdp_layer_weights", "fedacg_server_update", "fedacg_lookahead", "scaffold_control_update",
                 "decaying_sigma_schedule"]:
        assert callable(getattr(server_math, name)), name
        assert name in server_math.__all__


def test_fedacg_two_rounds_hand_computed():
    lam = 0.85
    w0 = np.array([1.0, 2.0])
    # Round 1: m^(-1) = 0, so the look-ahead is w0 itself.
    np.testing.assert_allclose(fedacg_lookahead(w0, None, lam), [1.0, 2.0])
    w1, m1 = fedacg_server_update(w0, None, np.array([0.2, -0.4]), lam)
    np.testing.assert_allclose(m1, [0.2, -0.4])
    np.testing.assert_allclose(w1, [1.2, 1.6])
    # Round 2: look-ahead = [1.2 + 0.17, 1.6 - 0.34] = [1.37, 1.26].
    np.testing.assert_allclose(fedacg_lookahead(w1, m1, lam), [1.37, 1.26])
    # m2 = 0.85 * [0.2, -0.4] + [-0.1, 0.1] = [0.07, -0.24]; w2 = w1 + m2 = [1.27, 1.36],
    # which is also look-ahead + mean delta (= the mean client model).
    w2, m2 = fedacg_server_update(w1, m1, np.array([-0.1, 0.1]), lam)
    np.testing.assert_allclose(m2, [0.07, -0.24])
    np.testing.assert_allclose(w2, [1.27, 1.36])
    with pytest.raises(ValueError):
        fedacg_server_update(w0, np.zeros(3), np.zeros(2), lam)


def test_scaffold_option_two_hand_computed():
    # c_i - c = [0.05, -0.25]; (x - y)/(K lr) = [0.2, -0.1]/0.4 = [0.5, -0.25] -> [0.55, -0.5].
    new_ci = scaffold_control_update(np.array([0.1, -0.2]), np.array([0.05, 0.05]), np.array([1.0, 1.0]),
                                     np.array([0.8, 1.1]), lr=0.1, num_steps=4)
    np.testing.assert_allclose(new_ci, [0.55, -0.5])
    with pytest.raises(ValueError):
        scaffold_control_update(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), lr=0.1, num_steps=0)


def test_decaying_sigma_schedule():
    np.testing.assert_allclose(decaying_sigma_schedule(4, 0.5), [1.0, 0.5, 0.25, 0.125])
    np.testing.assert_allclose(decaying_sigma_schedule(3, 1.0), [1.0, 1.0, 1.0])
    with pytest.raises(ValueError):
        decaying_sigma_schedule(0, 0.9)
    with pytest.raises(ValueError):
        decaying_sigma_schedule(3, 1.5)
