"""`raysim audit` has teeth: within the claim with the real engine, far above it without noise."""

from __future__ import annotations

import pytest
import torch

import raysim.privacy.clipping as clipping
from raysim.audit import run_audit
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


def test_real_engine_stays_within_the_claim():
    result = run_audit(_cfg(), canaries=500)
    assert result.epsilon_accounted == pytest.approx(2.0, abs=1e-3)
    assert result.epsilon_lower_bound <= 2.0 and result.correct > result.guesses / 2


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
    assert "ε_lb = " in out and "accounted ε = 2.000" in out
    assert main(["audit", str(QUICKSTART), "--set", "privacy.epsilon=null", "--set", "method=fedavg"]) == 2
