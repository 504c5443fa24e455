"""ADPC's options: reading the pooled histogram (``adpc.read``) and decoupling the step from C (``adpc.step``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.base import ClientHooks, MethodContext
from raysim.algorithms.clip_rules import (
    example_norm_histogram, histogram_edges, histogram_quantile, normalized_lr_scale, pooled_histogram_quantile,
)
from raysim.algorithms.feddimdp import FedDimDPServer
from raysim.algorithms.registry import get_method
from raysim.config import ConfigError, config_from_dict
from raysim.run_plan import run_id_for
from raysim.messages import ClientResult, ClientTask, RoundPayload
from raysim.privacy.grad_sample import make_engine
from raysim.privacy.plan import not_covered, plan_noise, side_channels
from raysim.training import local_train

EDGES = histogram_edges(48, 1e-3, 1e3)
BIN = math.log(EDGES[1] / EDGES[0])


def _client_histograms(rng, sizes, centres):
    """Noiseless per-client histograms of log-normal norms around each client's own centre, and all norms."""
    hists, norms = [], []
    for n, c in zip(sizes, centres):
        x = np.exp(rng.normal(math.log(c), 0.8, n))
        hists.append(example_norm_histogram(x, EDGES))
        norms.append(x)
    return hists, np.concatenate(norms)


# --------------------------------------------------------------------------- adpc.read = pooled

@pytest.mark.parametrize("seed", range(6))
def test_pooled_read_of_noiseless_histograms_is_within_one_bin_of_the_pooled_median(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 60, size=10)
    centres = np.exp(rng.uniform(-2.0, 3.0, size=10))       # clients far apart: pooled ≠ median of medians
    hists, norms = _client_histograms(rng, sizes, centres)
    got = pooled_histogram_quantile(hists, EDGES, 0.5)
    assert abs(math.log(got) - math.log(np.median(norms))) <= BIN
    q90 = pooled_histogram_quantile(hists, EDGES, 0.9)
    assert abs(math.log(q90) - math.log(np.quantile(norms, 0.9))) <= BIN


def test_pooled_read_is_the_read_of_the_summed_histogram_clamping_only_the_sum():
    a, b = np.zeros(50), np.zeros(50)
    a[10], a[30] = 4.0, -3.0
    b[30] = 3.0                    # cancels a's negative noise: the sum holds mass only in cell 10
    lo, hi = EDGES[9], EDGES[10]
    assert pooled_histogram_quantile([a, b], EDGES, 0.5) == pytest.approx(math.exp((math.log(lo) + math.log(hi)) / 2))
    assert pooled_histogram_quantile([a, b], EDGES, 0.5) == histogram_quantile(a + b, EDGES, 0.5)
    # Clamping each client first would keep b's +3 in cell 30 and move the median there.
    assert histogram_quantile(np.clip(a, 0, None) + np.clip(b, 0, None), EDGES, 0.5) < EDGES[10]
    assert histogram_quantile(np.clip(a, 0, None) + np.clip(b, 0, None), EDGES, 0.9) > EDGES[29]
    with pytest.raises(ValueError):
        pooled_histogram_quantile([], EDGES, 0.5)


def test_pooled_read_tracks_small_clients_that_the_per_client_read_loses_in_noise():
    """σ_h = 25 on 10 clients of 30–60 examples around 10: the clamped noise pulls each client's read
    towards the grid's own median (1 on [1e-3, 1e3]); summed, the signal grows 10× and the noise √10×."""
    rng = np.random.default_rng(0)
    pooled_err, per_client_err = [], []
    for _ in range(50):
        hists, norms = _client_histograms(rng, rng.integers(30, 60, size=10), np.full(10, 10.0))
        noisy = [h + rng.normal(0.0, 25.0, h.shape) for h in hists]
        truth = math.log(np.median(norms))
        pooled_err.append(abs(math.log(pooled_histogram_quantile(noisy, EDGES, 0.5)) - truth))
        reads = [histogram_quantile(h, EDGES, 0.5) for h in noisy]
        per_client_err.append(abs(math.log(np.nanmedian(reads)) - truth))
    assert np.median(pooled_err) < 0.75 * np.median(per_client_err)


# --------------------------------------------------------------------------- the server

def _server(**adpc):
    cfg = config_from_dict({"method": "feddimdp", "num_clients": 3, "adpc": adpc, "runtime": {"executor": "serial"}})
    ctx = MethodContext(cfg, "per_sample", 2, ((0, 2),), np.full(3, 100), np.full(3, 4), np.full(3, 1.0))
    return FedDimDPServer(ctx)


class _States:
    def get(self, client_id, default=None):
        return default


def _results(hists, server_round=1):
    return [ClientResult(i, server_round, 100, 4, torch.tensor([0.1, -0.1]), 0.0, 0.0,
                         uploads={"norm_histogram": h, "val_f1": 0.5})
            for i, h in enumerate(hists)]


def test_server_sets_c_from_the_pooled_read_and_logs_each_clients_read():
    hists = [np.zeros(50) for _ in range(3)]
    hists[0][20], hists[1][21], hists[2][40] = 10.0, 10.0, 100.0   # the pooled mass sits mostly in cell 40
    w = torch.zeros(2)
    pooled, per_client = _server(read="pooled"), _server(read="per_client")
    agg_p, agg_c = pooled.aggregate(1, w, _results(hists)), per_client.aggregate(1, w, _results(hists))
    assert agg_p.round_logs["next_clip_norm"] == pytest.approx(pooled_histogram_quantile(hists, EDGES, 0.5))
    reads = [histogram_quantile(h, EDGES, 0.5) for h in hists]
    assert agg_c.round_logs["next_clip_norm"] == pytest.approx(reads[1])               # the median of three
    assert [row["example_norm_median"] for row in agg_p.client_logs] == pytest.approx(reads)
    assert pooled.current_clip > 10 * per_client.current_clip


@pytest.mark.parametrize("clip", [0.25, 1.0, 7.5])
def test_normalized_step_sends_lr_scale_c0_over_c(clip):
    for step, adpc_on, expected in [("normalized", True, 2.0 / clip), ("coupled", True, 1.0), ("normalized", False, 1.0)]:
        server = _server(step=step, c0=2.0, c_min=0.1)
        server.use_adpc = adpc_on
        server.current_clip = clip
        tasks = server.tasks(3, _States(), [0, 2])
        assert [t.lr_scale for t in tasks] == [expected, expected]
        assert [t.clip_norm for t in tasks] == [clip, clip]
    assert normalized_lr_scale(2.0, clip) == 2.0 / clip
    with pytest.raises(ValueError):
        normalized_lr_scale(1.0, 0.0)


def test_normalized_step_measures_update_norm_per_step_with_the_lr_the_clients_used():
    server = _server(step="normalized", c0=1.0)
    server.current_clip = 4.0
    agg = server.aggregate(1, torch.zeros(2), _results([np.ones(50)] * 3))
    norm = float(torch.tensor([0.1, -0.1]).norm())
    expected = norm / (server.cfg.lr * 0.25 * 4)
    assert [row["update_norm_per_step"] for row in agg.client_logs] == pytest.approx([expected] * 3)


@pytest.mark.parametrize("scale", [0.25, 3.0])
def test_one_local_step_scales_the_update_exactly_by_lr_scale(scale):
    """A client of 8 examples with batch 16 takes one step on all of them (q = 1): Δw = −lr·scale·g̃, and
    g̃ (clipping and the seeded noise) does not depend on the lr."""
    cfg = config_from_dict({"method": "feddimdp", "batch_size": 16, "lr": 0.1, "runtime": {"executor": "serial"}})
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    deltas = []
    for s in (1.0, scale):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 3))
        start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        task = ClientTask(0, 1, 0.5, 1.0, None, s)
        hooks = ClientHooks(cfg, RoundPayload(1, start, start), task)
        stats = local_train(model, x, y, hooks, clipping="per_sample", engine=make_engine("bk"), per_layer=False,
                            seed=0, client_id=0)
        assert stats.num_steps == 1
        deltas.append(torch.cat([p.detach().flatten() for p in model.parameters()]) - start)
    assert deltas[0].norm() > 0
    torch.testing.assert_close(deltas[1], scale * deltas[0], rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- config and privacy

@pytest.mark.parametrize("adpc, message", [
    ({"read": "mean"}, "config key 'adpc.read': unknown value 'mean'; choose one of per_client, pooled"),
    ({"step": "auto"}, "config key 'adpc.step': unknown value 'auto'; choose one of coupled, normalized"),
])
def test_new_keys_are_validated_in_one_line(adpc, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"method": "feddimdp", "adpc": adpc})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_options_cost_no_privacy():
    """Both read the same releases (post-processing): same declared release, same calibrated σ."""
    spec = get_method("feddimdp")
    q, steps = np.array([0.05, 0.2]), np.array([20, 5])
    base = config_from_dict({"method": "feddimdp", "rounds": 3, "privacy": {"epsilon": 8.0}})
    other = config_from_dict({"method": "feddimdp", "rounds": 3, "privacy": {"epsilon": 8.0},
                              "adpc": {"read": "pooled", "step": "normalized"}})
    assert [(c.name, c.noise_multiplier) for c in side_channels(spec, other)] == \
        [(c.name, c.noise_multiplier) for c in side_channels(spec, base)]
    assert not_covered(spec, other, "per_sample") == not_covered(spec, base, "per_sample")
    np.testing.assert_array_equal(plan_noise(spec, other, "per_sample", q, steps),
                                  plan_noise(spec, base, "per_sample", q, steps))


def test_the_options_get_their_own_run_ids():
    """Each option is a different experiment; without ADPC the options change nothing, nor the run id."""
    ids = {run_id_for(config_from_dict({"method": "feddimdp", "lr": 0.3, "adpc": {"read": r, "step": s}}))
           for r in ("per_client", "pooled") for s in ("coupled", "normalized")}
    assert len(ids) == 4
    for method, extra in [("fedsa", {}), ("feddimdp-no-adpc", {}), ("feddimdp", {"feddimdp": {"adpc": False}})]:
        same = {run_id_for(config_from_dict({"method": method, **extra, "adpc": {"read": r, "step": s}}))
                for r in ("per_client", "pooled") for s in ("coupled", "normalized")}
        assert len(same) == 1, method          # without ADPC the keys change nothing, nor the run id
