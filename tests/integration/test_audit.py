"""`raysim audit` has teeth: within the claim with the real engine, above it with a clipping or noise bug."""

from __future__ import annotations

import pytest
import torch

import raysim.privacy.clipping as clipping
import raysim.privacy.grad_sample as grad_sample
from raysim.audit import AuditError, run_audit
from raysim.cli import main
from raysim.config import apply_overrides, config_from_dict, read_yaml
from tests.conftest import REPO

QUICKSTART = REPO / "experiments" / "quickstart.yaml"


def _cfg(**changes):
    pairs = [("method", "fedsa"), ("privacy.epsilon", 2.0), *changes.items()]
    return config_from_dict(apply_overrides(read_yaml(QUICKSTART), pairs))


@pytest.fixture()
def no_noise(monkeypatch):
    """Switch DP noise off inside the engine (a test fixture, never a user option)."""
    monkeypatch.setattr(clipping, "_gaussian_like", lambda grads, std, gen: [torch.zeros_like(g) for g in grads])


@pytest.fixture()
def largest_layer_unclipped(monkeypatch):
    """Injected bug: the clip factors leave the layer with the most parameters unclipped (a fixture)."""
    real = grad_sample.clip_factors

    def buggy(per_layer_norms, clip_norm, per_layer=False):
        factors, clipped = real(per_layer_norms, clip_norm, per_layer)
        factors = factors.clone()
        factors[:, _LARGEST[0]] = 1.0
        return factors, clipped

    monkeypatch.setattr(grad_sample, "clip_factors", buggy)


@pytest.fixture()
def no_clipping(monkeypatch):
    """Injected bug: every clip factor is 1, nothing is clipped (a fixture)."""
    real = grad_sample.clip_factors

    def buggy(per_layer_norms, clip_norm, per_layer=False):
        factors, clipped = real(per_layer_norms, clip_norm, per_layer)
        return torch.ones_like(factors), clipped

    monkeypatch.setattr(grad_sample, "clip_factors", buggy)


def _largest_layer() -> int:
    from raysim.algorithms.registry import get_method
    from raysim.experiment import prepare
    from raysim.models import model_for
    cfg = _cfg()
    train, _ = prepare(cfg)
    model = model_for(cfg, train.info, get_method(cfg.method).model_options(cfg))
    sizes = [sum(p.numel() for p in layer.parameters(recurse=False))
             for layer in grad_sample.parametrised_layers(model)]
    return max(range(len(sizes)), key=sizes.__getitem__)


_LARGEST: list[int] = []


@pytest.fixture(autouse=True)
def _largest():
    if not _LARGEST:
        _LARGEST.append(_largest_layer())


def test_real_engine_stays_within_the_claim():
    result = run_audit(_cfg(), canaries=500)
    assert result.epsilon_accounted == pytest.approx(2.0, abs=1e-3)
    assert result.epsilon_lower_bound <= 2.0 and result.correct > result.guesses / 2
    assert result.canary_norm == 10.0 and result.epsilon_ceiling == pytest.approx(3.479, abs=1e-3)


def test_one_layer_left_unclipped_exceeds_the_claim(largest_layer_unclipped):
    result = run_audit(_cfg(), canaries=500)
    assert result.epsilon_lower_bound > 2.0, result


def test_no_clipping_exceeds_the_claim(no_clipping):
    # Unclipped DP-SGD diverges at the quickstart's lr 0.2 (below); at lr 0.05 it trains, and the
    # canaries, let through at 10·C, are all found.
    result = run_audit(_cfg(lr=0.05), canaries=500)
    assert result.epsilon_lower_bound > 2.0 and result.correct == result.guesses, result


def test_a_diverged_training_is_refused_not_scored(no_clipping):
    with pytest.raises(AuditError, match=r"diverged in round \d+ \(non-finite parameters\)"):
        run_audit(_cfg(), canaries=500)


def test_without_noise_the_audit_exceeds_the_claim(no_noise):
    result = run_audit(_cfg(), canaries=500)   # 100 guesses, all right: ε_lb ≈ 3.5
    assert result.epsilon_lower_bound > 2.0 and result.correct == result.guesses


def test_batch_clipping_is_audited(no_noise):
    # its ε_lb with noise is reported in docs/privacy.md; without noise the canaries are found too
    result = run_audit(_cfg(**{"privacy.clipping": "batch"}), canaries=500)
    assert result.clipping == "batch" and result.epsilon_lower_bound > 2.0


def test_cli_prints_the_bound_next_to_the_accounted_epsilon(capsys):
    assert main(["audit", str(QUICKSTART), "--set", "method=fedsa", "--set", "privacy.epsilon=2", "--canaries", "500"]) == 0
    out = capsys.readouterr().out
    assert "ε_lb = " in out and "accounted ε = 2.000" in out and "ceiling 3.479" in out and "/100 guesses" in out
    assert main(["audit", str(QUICKSTART), "--set", "method=fedsa", "--set", "privacy.epsilon=2", "--canaries", "500",
                 "--guess-fraction", "0.5"]) == 0
    assert "/500 guesses" in capsys.readouterr().out
    assert main(["audit", str(QUICKSTART), "--canaries", "500", "--guess-fraction", "0.7"]) == 2
    assert main(["audit", str(QUICKSTART), "--set", "privacy.epsilon=null", "--set", "method=fedavg"]) == 2
