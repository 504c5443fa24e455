"""Baseline methods driven through their server and hook classes on toys; expectations by hand."""

from __future__ import annotations

from types import SimpleNamespace

import json
import dataclasses
import math

import numpy as np
import pytest
import torch

from raysim.algorithms.acdn import ACDNServer
from raysim.algorithms.awdp import AWDPServer
from raysim.algorithms.base import MethodContext
from raysim.algorithms.fedacg import FedACGHooks, FedACGServer
from raysim.algorithms.fedprox import ProximalHooks
from raysim.algorithms.quantile import QuantileClipServer, quantile_uploads
from raysim.algorithms.registry import get_method
from raysim.algorithms.sam import SAMBothHooks, SAMHooks
from raysim.algorithms.scaffold import ScaffoldHooks, ScaffoldServer
from raysim.config import ConfigError, config_from_dict
from raysim.privacy.accounting import StepEvent, compute_epsilon
from raysim.privacy.clipping import PrivateGrad
from raysim.privacy.plan import not_covered, plan_noise, side_channels
from raysim.rng import np_generator
from raysim.messages import ClientResult, ClientTask, RoundPayload


def _cfg(**sections):
    return config_from_dict({"runtime": {"executor": "serial"}, **sections})


def _ctx(cfg, num_params=2, layer_slices=((0, 2),), num_clients=2, sigma=0.0):
    return MethodContext(cfg, "per_sample", num_params, layer_slices, np.full(num_clients, 100), np.full(num_clients, 4),
                         np.full(num_clients, sigma))


def _result(cid, delta, *, server_round=1, num_samples=100, num_steps=4, frac_clipped=0.0, per_layer=None, state=None,
            uploads=None):
    up = dict(uploads or {})
    if per_layer is not None:
        up["per_layer_norms"] = per_layer
    return ClientResult(cid, server_round, num_samples, num_steps, torch.tensor(delta, dtype=torch.float32), 0.0,
                        frac_clipped, uploads=up, client_state=state)


def _vec(*x):
    return torch.tensor(x, dtype=torch.float32)


# --------------------------------------------------------------------------- FedACG

def test_fedacg_lookahead_and_momentum_over_two_rounds():
    cfg = _cfg(num_clients=2, fedacg={"lam": 0.5, "beta": 0.1})
    server = FedACGServer(_ctx(cfg))
    w0 = _vec(1.0, -1.0)
    p1 = server.payload(1, w0)
    # m = 0 before round 1: the look-ahead is w0; it is also the proximal centre.
    assert torch.equal(p1.start_weights, w0) and torch.equal(p1.global_weights, w0)
    agg1 = server.aggregate(1, w0, [_result(0, [0.2, 0.4]), _result(1, [0.4, 0.0], num_samples=300)])
    # mean Δ (uniform, not n-weighted) = [0.3, 0.2] = m1; w1 = w0 + m1 = [1.3, -0.8].
    torch.testing.assert_close(agg1.global_weights, _vec(1.3, -0.8))
    p2 = server.payload(2, agg1.global_weights)
    # w̃ = w1 + 0.5 m1 = [1.45, -0.7].
    torch.testing.assert_close(p2.start_weights, _vec(1.45, -0.7))
    assert torch.equal(p2.global_weights, p2.start_weights)
    agg2 = server.aggregate(2, agg1.global_weights, [_result(0, [-0.1, 0.1]), _result(1, [0.1, 0.3])])
    # m2 = 0.5 [0.3, 0.2] + [0.0, 0.2] = [0.15, 0.3]; w2 = [1.45, -0.5] = w̃ + mean Δ.
    torch.testing.assert_close(agg2.global_weights, _vec(1.45, -0.5))
    assert [row["aggregation_weight"] for row in agg2.client_logs] == [0.5, 0.5]


def test_fedacg_and_fedprox_proximal_gradients():
    cfg = _cfg(fedacg={"beta": 0.1}, fedprox={"mu": 0.5})
    centre = _vec(1.0, 2.0, 3.0)
    payload = RoundPayload(1, centre.clone(), centre.clone(), {})
    params = [torch.nn.Parameter(torch.tensor([2.0])), torch.nn.Parameter(torch.tensor([[0.0, 5.0]]))]
    task = ClientTask(0, 1, 1.0, 0.0)
    acg = FedACGHooks(cfg, payload, task).extra_gradient(params)
    torch.testing.assert_close(acg[0], torch.tensor([0.1]))          # 0.1 (2 - 1)
    torch.testing.assert_close(acg[1], torch.tensor([[-0.2, 0.2]]))  # 0.1 ([0, 5] - [2, 3])
    prox = ProximalHooks(cfg, payload, task).extra_gradient(params)
    torch.testing.assert_close(prox[1], torch.tensor([[-1.0, 1.0]]))
    assert get_method("fedprox").client is ProximalHooks and not get_method("fedprox").private


# --------------------------------------------------------------------------- SCAFFOLD

def test_scaffold_control_variates_on_a_toy():
    cfg = _cfg(num_clients=2, lr=0.5)
    server = ScaffoldServer(_ctx(cfg))
    w0 = _vec(0.0, 0.0)
    states: dict = {}

    def client_round(t, w, ends):
        payload = server.payload(t, w)
        results = []
        for task, end in zip(server.tasks(t, states, [0, 1]), ends):
            hooks = ScaffoldHooks(cfg, payload, task)
            params = [torch.nn.Parameter(payload.start_weights.clone())]
            corr = hooks.extra_gradient(params)
            with torch.no_grad():
                params[0].copy_(_vec(*end))
            state = hooks.finalize(params, num_steps=2)
            results.append(_result(task.client_id, (_vec(*end) - payload.start_weights).tolist(), server_round=t,
                                   num_steps=2, state=state))
            states[task.client_id] = state
        return results, corr

    # Round 1: c = c_i = 0, so the correction is 0 and c_i⁺ = (x − y_i)/(K lr) = (x − y_i)/1.
    r1, corr = client_round(1, w0, [[-1.0, 0.0], [0.0, -2.0]])
    torch.testing.assert_close(corr[0], _vec(0.0, 0.0))
    torch.testing.assert_close(states[0]["control"], _vec(1.0, 0.0))
    torch.testing.assert_close(states[1]["control"], _vec(0.0, 2.0))
    agg = server.aggregate(1, w0, r1)
    torch.testing.assert_close(agg.global_weights, _vec(-0.5, -1.0))   # uniform mean of Δy
    torch.testing.assert_close(server.control, _vec(0.5, 1.0))         # (1/N) Σ Δc_i
    # Round 2: client 0 starts from x = [-0.5, -1] with c − c_0 = [-0.5, 1] as its correction.
    r2, _ = client_round(2, agg.global_weights, [[-1.5, -1.0], [-0.5, -1.0]])
    # c_0⁺ = [1, 0] − [0.5, 1] + ([-0.5, -1] − [-1.5, -1]) / 1 = [1.5, -1];
    # c_1⁺ = [0, 2] − [0.5, 1] + 0 = [-0.5, 1].
    torch.testing.assert_close(states[0]["control"], _vec(1.5, -1.0))
    torch.testing.assert_close(states[1]["control"], _vec(-0.5, 1.0))
    server.aggregate(2, agg.global_weights, r2)
    # Δc = [0.5, -1] and [-0.5, -1] -> c = [0.5, 1] + [0, -1] = [0.5, 0] (= mean of the c_i, as it must stay).
    torch.testing.assert_close(server.control, _vec(0.5, 0.0))
    hooks = ScaffoldHooks(cfg, server.payload(3, w0), server.tasks(3, states, [0, 1])[0])
    torch.testing.assert_close(hooks.extra_gradient([torch.nn.Parameter(torch.zeros(2))])[0], _vec(-1.0, 1.0))


# --------------------------------------------------------------------------- quantile clipping

def test_quantile_clip_update_through_the_server():
    cfg = _cfg(num_clients=4, seed=3, privacy={"clip_norm": 2.0}, quantile={"eta_c": 0.2, "target_quantile": 0.5})
    server = QuantileClipServer(_ctx(cfg, num_clients=4))
    assert server.clip_norm(1) == 2.0 and server.tasks(1, {}, range(4))[0].clip_norm == 2.0
    fracs = [0.0, 0.5, 1.0, 0.9]    # fractions of clipped examples of 10 each -> counts [10, 5, 0, 1], b̄ = 16/40
    results = [_result(i, [0.0, 0.0], frac_clipped=f, uploads={"unclipped_count": 10 * (1.0 - f)})
               for i, f in enumerate(fracs)]
    results = [dataclasses.replace(r, num_samples=10) for r in results]
    agg = server.aggregate(1, _vec(0.0, 0.0), results)
    expected = 2.0 * math.exp(-0.2 * (0.4 - 0.5))
    assert agg.round_logs["clipped_fraction_noisy"] == pytest.approx(0.4)
    assert agg.round_logs["next_clip_norm"] == pytest.approx(expected)
    assert server.clip_norm(2) == pytest.approx(expected)

    # The client's c_i counts its pre-round norms (one per example, at the round's starting model) that are
    # <= C^(t), whatever its DP-SGD steps clipped (frac_clipped is not read). Each *client* adds σ_b z_i to
    # its own count, z_i from its (seed, "quantile-noise", round, client) stream, before upload; the server
    # divides the sum by the public Σ n_i.
    (upload,) = quantile_uploads(_cfg(num_clients=4, seed=3, quantile={"noise_multiplier": 2.0}))
    assert upload.needs_example_norms and upload.release.kind == "gaussian" and upload.release.noise_multiplier == 2.0
    noisy_c = []
    for i, f in enumerate(fracs):
        norms = np.where(np.arange(10) < round(10 * f), 2.5, 1.5)     # C = 2: a fraction f above it
        ctx = SimpleNamespace(cfg=_cfg(seed=3, quantile={"noise_multiplier": 2.0}), frac_clipped=0.123,
                              example_norms=norms, task=SimpleNamespace(clip_norm=2.0),
                              rng=lambda purpose, i=i: np_generator(3, purpose, 1, i))
        noisy_c.append(upload.compute(ctx))
    z = [np_generator(3, "quantile-noise", 1, i).standard_normal() for i in range(4)]
    assert noisy_c == pytest.approx([10 * (1.0 - f) + 2.0 * zi for f, zi in zip(fracs, z)])
    noisy = QuantileClipServer(_ctx(_cfg(num_clients=4, seed=3, quantile={"noise_multiplier": 2.0}), num_clients=4))
    agg = noisy.aggregate(1, _vec(0.0, 0.0), [dataclasses.replace(_result(i, [0.0, 0.0], uploads={"unclipped_count": c}),
                                                                  num_samples=10) for i, c in enumerate(noisy_c)])
    assert agg.round_logs["clipped_fraction_noisy"] == pytest.approx(sum(noisy_c) / 40)
    # The default is private: σ_b = 25 (docs/methods.md).
    assert quantile_uploads(_cfg())[0].release.noise_multiplier == 25.0

    # norm_source = update: b_i = 1[‖Δ_i‖/(lr τ) ≤ C]; lr 0.5, τ 4 -> s = [0.5, 1.5, 2.5] vs C = 1: b̄ = 2/3.
    upd = QuantileClipServer(_ctx(_cfg(num_clients=3, lr=0.5, quantile={"norm_source": "update"}), num_clients=3))
    deltas = [[0.6, 0.8], [1.8, 2.4], [3.0, 4.0]]   # norms 1, 3, 5
    agg = upd.aggregate(1, _vec(0.0, 0.0), [_result(i, d) for i, d in enumerate(deltas)])
    assert agg.round_logs["clipped_fraction_noisy"] == pytest.approx(1 / 3)
    assert upd.clip_norm(2) == pytest.approx(math.exp(-0.2 * (1 / 3 - 0.5)))


def test_quantile_bits_are_a_side_channel_only_when_read_from_private_data():
    spec = get_method("dp-fedavg-adaptive")
    noisy = _cfg(quantile={"noise_multiplier": 3.0})
    assert [(c.name, c.noise_multiplier, c.per_round) for c in side_channels(spec, noisy)] == [("unclipped_count", 3.0, 1)]
    assert "unclipped_count" not in not_covered(spec, noisy, "per_sample")
    assert "unclipped_count" not in not_covered(spec, _cfg(), "per_sample")     # private by default
    plain = _cfg(quantile={"noise_multiplier": 0.0})
    assert "unclipped_count" in not_covered(spec, plain, "per_sample") and side_channels(spec, plain) == []
    update = _cfg(quantile={"noise_multiplier": 3.0, "norm_source": "update"})   # post-processing of Δw_i
    assert side_channels(spec, update) == [] and "unclipped_count" not in not_covered(spec, update, "per_sample")
    assert side_channels(get_method("fedsa"), noisy) == []


# --------------------------------------------------------------------------- DP-FedSAM

class _Quadratic:
    """compute() for the loss ½‖A w‖² on one Linear weight: records where it was evaluated."""

    def __init__(self, params):
        self.params = params
        self.a = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
        self.points = []

    def __call__(self):
        w = self.params[0].detach().clone()
        self.points.append(w)
        grad = self.a.T @ self.a @ w.reshape(-1)
        return PrivateGrad(grads=[grad.reshape(w.shape)], loss_mean=float(0.5 * (self.a @ w.reshape(-1)).pow(2).sum()),
                           batch_size=1, num_clipped=0, frac_clipped=0.0)


def _sam_setup(mode, rho=0.1):
    cfg = _cfg(sam={"rho": rho, "mode": mode})
    w = torch.tensor([[1.0, -2.0]])
    params = [torch.nn.Parameter(w.clone())]
    hooks = SAMHooks(cfg, RoundPayload(1, w.reshape(-1), w.reshape(-1), {}), ClientTask(0, 1, 1.0, 0.0))
    return cfg, w, params, hooks, _Quadratic(params)


def _perturbed(w, g, rho):
    return w + rho * g / g.norm()


def test_sam_previous_mode_perturbs_with_the_last_private_gradient():
    cfg, w, params, hooks, compute = _sam_setup("previous")
    assert type(hooks) is SAMHooks and hooks.releases_per_step == 1 and SAMHooks.releases_for(cfg) == 1
    g1 = hooks.private_gradient(params, compute).grads[0]
    torch.testing.assert_close(compute.points[0], w)                 # first step: no perturbation
    torch.testing.assert_close(params[0].detach(), w)
    with torch.no_grad():
        params[0].sub_(0.05 * g1)                                    # the optimizer's step
    w2 = params[0].detach().clone()
    hooks.private_gradient(params, compute)
    torch.testing.assert_close(compute.points[1], _perturbed(w2, g1, 0.1))
    torch.testing.assert_close(params[0].detach(), w2, rtol=0, atol=0)   # restored exactly


def test_sam_both_mode_evaluates_at_the_ascent_point_with_two_releases():
    cfg, w, params, hooks, compute = _sam_setup("both", rho=0.2)
    assert type(hooks) is SAMBothHooks and hooks.releases_per_step == 2 and SAMHooks.releases_for(cfg) == 2
    out = hooks.private_gradient(params, compute)
    g_w = torch.tensor([[2.0, 0.0], [1.0, 3.0]]).T @ torch.tensor([[2.0, 0.0], [1.0, 3.0]]) @ w.reshape(-1)
    w_hat = _perturbed(w, g_w.reshape(w.shape), 0.2)
    assert len(compute.points) == 2
    torch.testing.assert_close(compute.points[0], w)
    torch.testing.assert_close(compute.points[1], w_hat)
    a = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
    torch.testing.assert_close(out.grads[0], (a.T @ a @ w_hat.reshape(-1)).reshape(w.shape))   # step with g(ŵ)
    assert out.loss_mean == pytest.approx(0.5 * float((a @ w.reshape(-1)).pow(2).sum()))      # loss at w
    torch.testing.assert_close(params[0].detach(), w, rtol=0, atol=0)


def test_sam_both_mode_is_accounted_as_two_releases():
    # Two Gaussian releases with σ on one Poisson batch compose to one with σ/√2: σ_both = √2 σ_previous.
    base = {"rounds": 3, "privacy": {"epsilon": 4.0}}
    q, steps = np.array([0.05]), np.array([20])
    prev = plan_noise(get_method("dp-fedsam"), _cfg(**base, sam={"mode": "previous"}), "per_sample", q, steps)
    both = plan_noise(get_method("dp-fedsam"), _cfg(**base, sam={"mode": "both"}), "per_sample", q, steps)
    assert both[0] / prev[0] == pytest.approx(math.sqrt(2.0), rel=2e-3)


# --------------------------------------------------------------------------- DP-ACDN

def test_acdn_schedule_reaches_the_target_epsilon():
    cfg = _cfg(num_clients=1, rounds=6, acdn={"gamma": 0.8}, privacy={"epsilon": 3.0})
    q, steps = 0.05, 30
    sigma0 = plan_noise(get_method("dp-acdn"), cfg, "per_sample", np.array([q]), np.array([steps]))
    server = ACDNServer(_ctx(cfg, num_clients=1, sigma=float(sigma0[0])))
    planned = [server.noise_multiplier(0, t) for t in range(1, 7)]
    np.testing.assert_allclose(planned, sigma0[0] * 0.8 ** np.arange(6))       # σ_t = σ_0 γ^(t−1)
    eps = compute_epsilon([StepEvent(q, s, steps) for s in planned], cfg.privacy.delta, cfg.privacy.accountant)
    assert 0.99 * 3.0 <= eps <= 3.0
    # A constant σ_0 over the same run would spend less: the decay is what the budget pays for.
    assert compute_epsilon([StepEvent(q, planned[0], steps * 6)], cfg.privacy.delta) < 0.99 * 3.0


def test_acdn_server_ema_of_aggregates():
    cfg = _cfg(num_clients=2, rounds=2, acdn={"momentum": 0.5, "gamma": 0.5})
    server = ACDNServer(_ctx(cfg))
    w0 = _vec(1.0, 1.0)
    # FedAvg aggregate with n = (100, 300): Δ̄ = 0.25 [4, 0] + 0.75 [0, 4] = [1, 3]; m = 0.5 Δ̄.
    agg1 = server.aggregate(1, w0, [_result(0, [4.0, 0.0]), _result(1, [0.0, 4.0], num_samples=300)])
    torch.testing.assert_close(agg1.global_weights, _vec(1.5, 2.5))
    assert agg1.round_logs["noise_multiplier_scale"] == 1.0
    # Δ̄2 = [2, 2]: m = 0.5 [0.5, 1.5] + 0.5 [2, 2] = [1.25, 1.75].
    agg2 = server.aggregate(2, agg1.global_weights, [_result(0, [2.0, 2.0]), _result(1, [2.0, 2.0])])
    torch.testing.assert_close(agg2.global_weights, _vec(2.75, 4.25))
    assert agg2.round_logs["noise_multiplier_scale"] == 0.5


# --------------------------------------------------------------------------- AWDP-FL

def test_awdp_per_layer_thresholds_follow_the_norm_ema():
    cfg = _cfg(num_clients=2, privacy={"clip_norm": 2.0}, awdp={"beta": 0.5})
    server = AWDPServer(_ctx(cfg, num_params=3, layer_slices=((0, 1), (1, 2), (2, 3))))
    assert get_method("awdp-fl").per_layer_clipping
    c1 = server.clip_norm(1)
    np.testing.assert_allclose(c1, [2.0 / math.sqrt(3)] * 3)
    results = [_result(0, [0.0, 0.0, 0.0], per_layer=[1.0, 2.0, 2.0]),
               _result(1, [0.0, 0.0, 0.0], per_layer=[3.0, 2.0, 6.0])]
    agg = server.aggregate(1, torch.zeros(3), results)
    assert json.loads(agg.client_logs[0]["layer_clip_norms"]) == pytest.approx(list(c1))
    # EMA starts at the mean [2, 2, 4]; ‖·‖ = √24, so w = [2, 2, 4] / √24 and C_k = 2 w_k.
    c2 = np.array(server.clip_norm(2))
    np.testing.assert_allclose(c2, 2.0 * np.array([2.0, 2.0, 4.0]) / math.sqrt(24.0))
    assert float(np.sum(c2 ** 2)) == pytest.approx(4.0)       # total sensitivity stays C = 2
    results = [_result(0, [0.0, 0.0, 0.0], per_layer=[4.0, 0.0, 0.0]),
               _result(1, [0.0, 0.0, 0.0], per_layer=[4.0, 0.0, 0.0])]
    agg = server.aggregate(2, torch.zeros(3), results)
    assert json.loads(agg.client_logs[1]["layer_clip_norms"]) == pytest.approx(list(c2))
    # EMA = 0.5 [2, 2, 4] + 0.5 [4, 0, 0] = [3, 1, 2]; ‖·‖ = √14.
    np.testing.assert_allclose(server.clip_norm(3), 2.0 * np.array([3.0, 1.0, 2.0]) / math.sqrt(14.0))


def test_baseline_config_keys_are_validated():
    for bad in ({"fedacg": {"lam": 1.0}}, {"acdn": {"momentum": -0.1}}, {"fedprox": {"mu": -1.0}},
                {"quantile": {"norm_source": "median"}}, {"quantile": {"target_quantile": 1.5}}, {"sam": {"rho": -0.1}}):
        with pytest.raises(ConfigError):
            _cfg(**bad)
