"""Every registered accountant against dp-accounting's own accountant composing the same ``DpEvent``s."""

from __future__ import annotations

import math
import pickle

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.privacy.accounting import (ACCOUNTANTS, Accountant, StepEvent, accountant_class, accountant_from_state,
                                       new_accountant, register_accountant)

#: How each built-in accountant is computed by dp-accounting itself, given our accountant's settings.
REFERENCES = {
    "pld": lambda settings: pld_privacy_accountant.PLDAccountant(value_discretization_interval=settings),
    "rdp": lambda settings: rdp_privacy_accountant.RdpAccountant(list(settings)),
}

RUNS = [
    [StepEvent(0.0128, 1.0, 70)],
    [StepEvent(0.07, 0.9, 14), StepEvent(1.0, 25.0, 3), StepEvent(0.07, 0.9, 14)],
    [StepEvent(0.004, 1.5, 10), StepEvent(0.02, 0.8, 40), StepEvent(1.0, 5.0, 1)],
    [StepEvent(1.0, 2.0, 4)],
]


def test_the_built_in_accountants_are_registered():
    assert {"pld", "rdp"} <= set(ACCOUNTANTS)
    assert set(REFERENCES) == set(ACCOUNTANTS), "a registered accountant needs its reference here"


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("events", RUNS, ids=lambda e: f"{len(e)}-events")
def test_accountant_matches_dp_accounting(name, events):
    acc = new_accountant(name, events)
    assert isinstance(acc, Accountant)
    ref = REFERENCES[name](acc.settings)
    for e in events:
        acc.compose(e)
        ref.compose(e.to_dp_event())
        for delta in (1e-5, 1e-3):
            assert acc.epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=1e-12, abs=1e-12)
        for eps in (0.5, 2.0):
            assert acc.delta(eps) == pytest.approx(ref.get_delta(eps), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_state_and_copy_round_trip(name):
    events = RUNS[1]
    acc = new_accountant(name, events)
    for e in events[:2]:
        acc.compose(e)
    twin = acc.copy()
    restored = accountant_from_state(pickle.loads(pickle.dumps(acc.state())))
    assert type(restored) is accountant_class(name)
    for other in (twin, restored):
        assert other.epsilon(1e-5) == acc.epsilon(1e-5)
    acc.compose(events[2])          # the copy and the restored accountant are independent of the original
    assert twin.epsilon(1e-5) == restored.epsilon(1e-5) < acc.epsilon(1e-5)
    twin.compose(events[2])
    restored.compose(events[2])
    assert twin.epsilon(1e-5) == restored.epsilon(1e-5) == acc.epsilon(1e-5)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_no_noise_is_no_privacy(name):
    acc = new_accountant(name)
    acc.compose(StepEvent(0.1, 0.0, 3))
    assert acc.epsilon(1e-5) == math.inf
    assert acc.delta(1.0) == pytest.approx(1.0)


def test_registration_refuses_duplicates_and_incomplete_classes():
    with pytest.raises(ValueError, match="already registered"):
        register_accountant(accountant_class("pld"))

    class Half:
        name = "half"

        def compose(self, event):
            pass
    with pytest.raises(ValueError, match="lacks"):
        register_accountant(Half)
    assert "half" not in ACCOUNTANTS


def test_dp_accounting_is_pinned_to_a_tested_range():
    """pyproject.toml pins the range these tests ran against."""
    from importlib.metadata import version
    major, minor = (int(x) for x in version("dp-accounting").split(".")[:2])
    assert (major, minor) == (0, 6)
    assert isinstance(dp_accounting.GaussianDpEvent(1.0), dp_accounting.DpEvent)
