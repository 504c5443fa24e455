"""`raysim audit` has teeth: within the claim with the real engine, above it with a bug injected into the
engine's own per-example code (``LayerStats.sq_norm``, ``LayerStats.clipped_sums``, ``clip_factors``),
for the smallest and for the largest layer.

The audited run is the whole federation (10 clients, 20 rounds, with 500 canaries in client 0), so each
audit takes tens of seconds on the 2-core VM: these tests are in ``make test-cluster``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import raysim.privacy.clipping as clipping
import raysim.privacy.grad_sample as grad_sample
import raysim.privacy.layer_grads as layer_grads
from raysim.algorithms.registry import get_method, resolve_preset
from raysim.audit import AuditError, run_audit
from raysim.cli import main
from raysim.config import apply_overrides, config_from_dict, read_yaml
from tests.conftest import REPO

pytestmark = pytest.mark.cluster

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
CANARIES = 2000


def _cfg(**changes):
    pairs = [("method", "fedsa"), ("privacy.epsilon", 2.0), *changes.items()]
    return config_from_dict(apply_overrides(read_yaml(QUICKSTART), pairs))


# The quickstart CNN's smallest layer is conv1 (Conv2d 1→32, 832 parameters), its largest fc1 (Linear
# 256→512, 131,584 parameters).
SMALLEST = lambda m: isinstance(m, nn.Conv2d) and m.in_channels == 1     # noqa: E731
LARGEST = lambda m: isinstance(m, nn.Linear) and m.out_features == 512   # noqa: E731
LAYERS = {"smallest": (SMALLEST, 0), "largest": (LARGEST, 2)}


def _norm_not_counted(monkeypatch, which):
    """Injected bug: the layer's per-example squared norms are left out (LayerStats.sq_norm = 0)."""
    real = layer_grads.LayerStats.__init__

    def buggy(self, layer, records, batch, dtype, device):
        real(self, layer, records, batch, dtype, device)
        if which(layer):
            self.sq_norm = torch.zeros_like(self.sq_norm)

    monkeypatch.setattr(layer_grads.LayerStats, "__init__", buggy)


def _sum_without_clip_factors(monkeypatch, which):
    """Injected bug: the layer's clipped sum weights every example by the 1/B scale alone, without its clip
    factor (LayerStats.clipped_sums)."""
    real = layer_grads.LayerStats.clipped_sums

    def buggy(self, factors, into=None):
        if which(self.layer):
            factors = torch.full_like(factors, 1.0 / 16)    # the quickstart's expected batch B = 16
        return real(self, factors, into)

    monkeypatch.setattr(layer_grads.LayerStats, "clipped_sums", buggy)


def _layer_unclipped(monkeypatch, index):
    """Injected bug: the clip factors leave one layer unclipped (clip_factors)."""
    real = grad_sample.clip_factors

    def buggy(per_layer_norms, clip_norm, per_layer=False):
        factors, clipped = real(per_layer_norms, clip_norm, per_layer)
        factors = factors.clone()
        factors[:, index] = 1.0
        return factors, clipped

    monkeypatch.setattr(grad_sample, "clip_factors", buggy)


@pytest.fixture(scope="module")
def clean():
    return run_audit(_cfg(), canaries=CANARIES)


def test_real_engine_stays_within_the_claim(clean):
    assert clean.epsilon_accounted == pytest.approx(2.0, abs=1e-3)
    assert not clean.refutes and clean.correct > clean.guesses / 2
    assert clean.path == "layer_pairs" and clean.canary_norm == 10.0
    # every parametrised layer holds canaries, the smallest included
    assert [p.layer for p in clean.per_layer] == ["conv1", "conv2", "fc1", "fc2"]
    assert all(p.canaries >= 100 for p in clean.per_layer) and sum(p.canaries for p in clean.per_layer) == CANARIES


@pytest.mark.parametrize("layer", ["smallest", "largest"])
@pytest.mark.parametrize("bug", ["norm_not_counted", "sum_without_clip_factors", "layer_unclipped"])
def test_an_engine_bug_in_one_layer_is_caught(monkeypatch, bug, layer):
    which, index = LAYERS[layer]
    if bug == "norm_not_counted":
        _norm_not_counted(monkeypatch, which)
    elif bug == "sum_without_clip_factors":
        _sum_without_clip_factors(monkeypatch, which)
    else:
        _layer_unclipped(monkeypatch, index)
    result = run_audit(_cfg(lr=0.05), canaries=CANARIES)
    assert result.refutes, result
    assert result.per_layer[index].epsilon_lower_bound > 2.0, result.per_layer


def test_without_noise_the_audit_exceeds_the_claim(monkeypatch):
    monkeypatch.setattr(clipping, "_gaussian_like", lambda grads, std, gen: [torch.zeros_like(g) for g in grads])
    result = run_audit(_cfg(), canaries=CANARIES)
    assert result.refutes and result.epsilon_lower_bound > 2.0


def test_a_diverged_training_is_refused_not_scored(monkeypatch):
    real = grad_sample.clip_factors
    monkeypatch.setattr(grad_sample, "clip_factors",
                        lambda n, c, per_layer=False: (torch.ones_like(real(n, c, per_layer)[0]), 0))
    with pytest.raises(AuditError, match=r"diverged"):
        run_audit(_cfg(), canaries=CANARIES)


def test_cli_prints_the_bound_next_to_the_accounted_epsilon(capsys):
    args = ["audit", str(QUICKSTART), "--set", "method=fedsa", "--set", "privacy.epsilon=2", "--canaries", str(CANARIES)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ε_lb = " in out and "accounted ε = 2.000 (per-client: the audited client's DP-SGD releases)" in out
    assert "/400 guesses" in out and "layer conv1" in out and "caveat" not in out
    assert main(["audit", str(QUICKSTART), "--set", "method=scaffold", "--set", "privacy.epsilon=2", "--set", "rounds=1",
                 "--canaries", "200"]) == 0
    assert "caveat (scaffold): from round 2 on" in capsys.readouterr().out
    assert main(["audit", str(QUICKSTART), "--canaries", "500", "--guess-fraction", "0.7"]) == 2
    assert main(["audit", str(QUICKSTART), "--set", "privacy.epsilon=null", "--set", "method=fedavg"]) == 2


# --------------------------------------------------------------------------- every method family, its own hooks

def _known_gap(method: str, why: str):
    return pytest.param(method, {}, marks=pytest.mark.xfail(strict=True, reason=why), id=f"{method}-default")


FAMILIES = [_known_gap("awdp-fl", "with the noise off the audit does not refute the claim (ε_lb 0.37, thresholded "
                                  "f-DP 1.994 < 2): per-layer clipping gives the real examples' conv1 gradients "
                                  "the canaries' threshold, and in conv1's 832 parameters they outweigh the "
                                  "canaries' own part (docs/privacy.md)"),
            ("dp-fedsam", {"sam.mode": "both"}), ("fedprox", {}), ("scaffold", {}),
            ("fedacg", {}),
            ("feddimdp", {}),
            ("dp-fedavg-adaptive", {}), ("dp-acdn", {}), ("fedsa", {"privacy.clipping": "batch"}),
            ("fedsa", {"privacy.engine": "vmap"})]


@pytest.mark.parametrize("method, changes", FAMILIES)
def test_every_method_family_is_audited_through_its_own_hooks(monkeypatch, method, changes):
    # With the noise switched off, canaries that the method's own client hooks (per-layer clipping, SAM's two
    # releases, proximal and control-variate terms, momentum, adaptive C) carry into the update are found.
    cfg = _cfg(method=method, rounds=3, **changes)
    clean = run_audit(cfg, canaries=400)
    # The audit's claim is the DP-SGD releases' ε. The run's ε = 2 composes them with the method's Gaussian side
    # channels (FedDimDP's histogram and F1), audited on their own below, so for such a method the claim is lower.
    side_channels = any(u.release.kind == "gaussian" for u in get_method(method).uploads(resolve_preset(cfg)))
    assert clean.epsilon_accounted == pytest.approx(2.0, abs=0.02) or (
        side_channels and 1.5 < clean.epsilon_accounted < 2.0), clean
    assert not clean.refutes, clean
    assert clean.path == ("batch_mean" if "privacy.clipping" in changes else
                          "sparse_extra" if "privacy.engine" in changes else "layer_pairs")
    monkeypatch.setattr(clipping, "_gaussian_like", lambda grads, std, gen: [torch.zeros_like(g) for g in grads])
    assert run_audit(cfg, canaries=400).refutes


# --------------------------------------------------------------------------- the Gaussian side channels

@pytest.mark.parametrize("method, upload", [("dp-fedavg-adaptive", "unclipped_count"), ("feddimdp", "norm_histogram")])
def test_side_channels_are_audited_and_a_tenth_of_the_noise_is_caught(monkeypatch, method, upload):
    import numpy as np

    import raysim.algorithms.feddimdp as feddimdp
    import raysim.algorithms.quantile as quantile
    from raysim.audit import audit_side_channels
    cfg = _cfg(method=method)
    (audit,) = [s for s in audit_side_channels(cfg, releases=4000) if s.name == upload]
    assert audit.audited and audit.noise_multiplier == 25.0 and audit.epsilon_lower_bound <= audit.epsilon_accounted
    if method == "feddimdp":
        (val,) = [s for s in audit_side_channels(cfg, releases=100) if s.name == "val_f1"]
        assert not val.audited and "clamped" in val.reason
        real = feddimdp._noisy_norm_histogram

        def buggy(ctx):   # the release's noise a tenth of what is accounted (an injected bug)
            counts = feddimdp.example_norm_histogram(ctx.example_norms, feddimdp.adpc_edges(ctx.cfg))
            return counts + ctx.rng("adpc-histogram-noise").normal(0.0, 2.5, counts.shape)
        monkeypatch.setattr(feddimdp, "_noisy_norm_histogram", buggy)
        assert real is not buggy
    else:
        def buggy(ctx):
            count = float(np.sum(ctx.example_norms <= ctx.task.clip_norm))
            return count + 2.5 * ctx.rng("quantile-noise").standard_normal()
        monkeypatch.setattr(quantile, "_unclipped_count", buggy)
    (bugged,) = [s for s in audit_side_channels(cfg, releases=4000) if s.name == upload]
    assert bugged.epsilon_lower_bound > bugged.epsilon_accounted, bugged
