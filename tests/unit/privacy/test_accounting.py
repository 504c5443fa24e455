"""Accounting layer: checked against dp_accounting and Opacus called directly, never against itself."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from raysim.privacy import accounting
from raysim.config import ConfigError
from raysim.privacy.accounting import (
    ACCOUNTANTS,
    AccountingError,
    PrivacyLedger,
    StepEvent,
    calibrate_noise_multiplier,
    compute_epsilon,
    compute_epsilon_steps,
    epsilon_many,
)

DELTA = 1e-5


def _poisson_gaussian(q: float, sigma: float, steps: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )


def _reference(event: dp_accounting.DpEvent, accountant: str, delta: float = DELTA) -> float:
    """dp_accounting with its default settings."""
    acc = pld_privacy_accountant.PLDAccountant() if accountant == "pld" else rdp_privacy_accountant.RdpAccountant()
    return acc.compose(event).get_epsilon(delta)


# ---------------------------------------------------------------------------------------------
# Contract shared by both accountants (dp_accounting's privacy_accountant_test.py pattern)
# ---------------------------------------------------------------------------------------------


class AccountantContract:
    """Properties every accountant must have; subclasses set ``accountant``."""

    accountant: str = ""

    def eps(self, events, delta=DELTA):
        return compute_epsilon(events, delta, self.accountant)

    def test_no_events_is_zero(self):
        assert self.eps([]) == 0.0
        assert self.eps([StepEvent(0.01, 1.0, 0)]) == 0.0

    def test_no_noise_is_infinite(self):
        assert self.eps([StepEvent(0.01, 0.0, 1)]) == math.inf
        assert self.eps([StepEvent(0.01, 1.0, 100), StepEvent(1.0, 0.0, 1)]) == math.inf
        # a noiseless event with no steps releases nothing
        assert math.isfinite(self.eps([StepEvent(0.01, 1.0, 100), StepEvent(1.0, 0.0, 0)]))

    def test_monotone_in_steps(self):
        values = [self.eps([StepEvent(0.02, 1.0, n)]) for n in (1, 10, 100, 1000)]
        assert all(a < b for a, b in zip(values, values[1:])), values

    def test_monotone_decreasing_in_sigma(self):
        values = [self.eps([StepEvent(0.02, s, 500)]) for s in (0.7, 1.0, 1.5, 3.0)]
        assert all(a > b for a, b in zip(values, values[1:])), values

    def test_monotone_decreasing_in_delta(self):
        values = [self.eps([StepEvent(0.02, 1.0, 500)], delta=d) for d in (1e-7, 1e-5, 1e-3)]
        assert all(a > b for a, b in zip(values, values[1:])), values

    def test_merging_equal_events_changes_nothing(self):
        split = self.eps([StepEvent(0.02, 1.0, 300), StepEvent(1.0, 5.0, 1), StepEvent(0.02, 1.0, 200)])
        whole = self.eps([StepEvent(0.02, 1.0, 500), StepEvent(1.0, 5.0, 1)])
        assert split == pytest.approx(whole, rel=1e-9)

    def test_bad_delta(self):
        for delta in (0.0, 1.0, -1e-5, 2.0):
            with pytest.raises(ValueError, match="delta"):
                self.eps([StepEvent(0.01, 1.0, 10)], delta=delta)


class TestPldContract(AccountantContract):
    accountant = "pld"


class TestRdpContract(AccountantContract):
    accountant = "rdp"


# ---------------------------------------------------------------------------------------------
# StepEvent
# ---------------------------------------------------------------------------------------------


def test_step_event_to_dp_event():
    assert StepEvent(0.01, 1.2, 7).to_dp_event() == _poisson_gaussian(0.01, 1.2, 7)
    # q == 1 is the plain Gaussian mechanism
    assert StepEvent(1.0, 3.0, 2).to_dp_event() == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(3.0), 2
    )
    assert StepEvent(0.5, 1.0, 0).to_dp_event() == dp_accounting.NoOpDpEvent()


def test_step_event_is_frozen():
    event = StepEvent(0.01, 1.0, 5)
    with pytest.raises(AttributeError):
        event.count = 6  # type: ignore[misc]


@pytest.mark.parametrize(
    "q, sigma, count",
    [(0.0, 1.0, 1), (1.5, 1.0, 1), (-0.1, 1.0, 1), (0.1, -1.0, 1), (0.1, math.inf, 1), (0.1, 1.0, -1), (0.1, 1.0, 1.5),
     (math.nan, 1.0, 1)],
)
def test_step_event_rejects_bad_values(q, sigma, count):
    with pytest.raises(ValueError):
        StepEvent(q, sigma, count)


def test_unknown_accountant():
    with pytest.raises(ValueError, match="accountant"):
        compute_epsilon([StepEvent(0.01, 1.0, 1)], DELTA, "gdp")


# ---------------------------------------------------------------------------------------------
# Known values and agreement with dp_accounting / Opacus
# ---------------------------------------------------------------------------------------------


def test_known_value_opacus_rdp():
    """Opacus' accountant test: sigma=1.5, q=0.04, 2250 steps, delta=1e-5 gives about 7.3291 with RDP."""
    from opacus.accountants import RDPAccountant

    opacus_acc = RDPAccountant()
    opacus_acc.history = [(1.5, 0.04, 2250)]  # (noise_multiplier, sample_rate, steps), as step() records
    opacus_eps = opacus_acc.get_epsilon(DELTA)
    ours = compute_epsilon_steps(0.04, 1.5, 2250, DELTA, "rdp")
    assert opacus_eps == pytest.approx(7.3291, abs=1e-3)
    assert ours == pytest.approx(opacus_eps, rel=1e-3)
    # PLD is tighter than RDP, never looser
    assert compute_epsilon_steps(0.04, 1.5, 2250, DELTA, "pld") < ours


_GRID = list(itertools.product([0.001, 0.01, 0.05, 0.2], [0.6, 1.0, 2.0], [10, 1000, 5000]))


def _grid_params(slow_if):
    # dp_accounting's default PLD settings take ~30 s over the whole grid; the costly cases
    # (sigma = 0.6, and q = 0.2 with 5000 steps) run only with -m slow.
    return [pytest.param(q, s, n, marks=pytest.mark.slow) if slow_if(q, s, n) else (q, s, n) for q, s, n in _GRID]


@pytest.mark.parametrize(
    "q, sigma, steps", _grid_params(lambda q, s, n: s == 0.6 or (q == 0.2 and n == 5000))
)
def test_pld_matches_dp_accounting_defaults(q, sigma, steps):
    expected = _reference(_poisson_gaussian(q, sigma, steps), "pld")
    ours = compute_epsilon_steps(q, sigma, steps, DELTA, "pld")
    assert ours == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("q, sigma, steps", _GRID)
def test_rdp_matches_dp_accounting(q, sigma, steps):
    expected = _reference(_poisson_gaussian(q, sigma, steps), "rdp")
    assert compute_epsilon_steps(q, sigma, steps, DELTA, "rdp") == pytest.approx(expected, rel=1e-6)


def test_pld_discretization_levels():
    # the per-step loss scale q / sigma picks the interval; never finer than dp_accounting's default
    assert accounting.pld_discretization_interval([StepEvent(0.0128, 1.0, 7000)]) == 1e-3
    assert accounting.pld_discretization_interval([StepEvent(0.001, 2.0, 10)]) == 1e-4
    assert accounting.pld_discretization_interval([StepEvent(0.001, 1.0, 10)]) == 2.5e-4
    # an event list is evaluated at the finest interval any of its events needs
    assert accounting.pld_discretization_interval(
        [StepEvent(0.0128, 1.0, 7000), StepEvent(0.001, 2.0, 10)]
    ) == 1e-4


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


_CALIBRATION_CASES = dict(
    q=st.floats(min_value=1e-3, max_value=0.5),
    steps=st.integers(min_value=1, max_value=3000),
    target=st.floats(min_value=0.5, max_value=20.0),
)


def _check_rdp_calibration(q, steps, target):
    sigma = calibrate_noise_multiplier(target, DELTA, [(q, steps)], "rdp")
    assert compute_epsilon_steps(q, sigma, steps, DELTA, "rdp") <= target
    assert compute_epsilon_steps(q, 0.99 * sigma, steps, DELTA, "rdp") > target  # tight


# dp_accounting's RDP is slow for q near 0.5 (about 2 s per calibration), so the default run draws a
# few examples with q up to 0.1 and the slow run many over the whole range.
@settings(max_examples=6, deadline=None)
@given(**{**_CALIBRATION_CASES, "q": st.floats(min_value=1e-3, max_value=0.1)})
def test_calibration_never_overshoots_rdp(q, steps, target):
    _check_rdp_calibration(q, steps, target)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(**_CALIBRATION_CASES)
def test_calibration_never_overshoots_rdp_many(q, steps, target):
    _check_rdp_calibration(q, steps, target)


@pytest.mark.parametrize("q, steps, target", [(0.0128, 7000, 8.0), (0.01, 100, 1.0), (0.2, 50, 3.0)])
def test_calibration_never_overshoots_pld(q, steps, target):
    sigma = calibrate_noise_multiplier(target, DELTA, [(q, steps)], "pld")
    assert compute_epsilon_steps(q, sigma, steps, DELTA, "pld") <= target
    assert compute_epsilon_steps(q, 0.99 * sigma, steps, DELTA, "pld") > target
    # against dp_accounting's default PLD settings the result is within 1 % of the target
    assert _reference(_poisson_gaussian(q, sigma, steps), "pld") == pytest.approx(target, rel=1e-2)


def test_calibration_matches_dp_accounting_calibrate():
    """The same answer as dp_accounting.calibrate_dp_mechanism with the same accountant settings."""
    q, steps, target = 0.02, 400, 2.0
    expected = dp_accounting.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant, lambda s: _poisson_gaussian(q, s, steps), target, DELTA
    )
    ours = calibrate_noise_multiplier(target, DELTA, [(q, steps)], "rdp")
    assert ours == pytest.approx(expected, rel=2e-4)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_calibration_with_decaying_schedule(accountant):
    shape = [(0.02, 100)] * 3
    schedule = [0.9**j for j in range(3)]
    target = 2.0
    sigma0 = calibrate_noise_multiplier(target, DELTA, shape, accountant, sigma_schedule=schedule)
    events = [StepEvent(q, sigma0 * m, n) for (q, n), m in zip(shape, schedule)]
    eps = compute_epsilon(events, DELTA, accountant)
    assert eps <= target
    assert eps == pytest.approx(target, rel=1e-2)
    # cross-check with dp_accounting directly on the composed event
    composed = dp_accounting.ComposedDpEvent([_poisson_gaussian(q, sigma0 * m, n) for (q, n), m in zip(shape, schedule)])
    assert _reference(composed, accountant) == pytest.approx(target, rel=1e-2)
    # a decaying schedule needs a larger starting sigma than a constant one: sigma0 throughout is under target
    assert compute_epsilon([StepEvent(q, sigma0, n) for q, n in shape], DELTA, accountant) < 0.99 * target


def _search(curve, target, hint=None, tol=1e-4):
    """``smallest_noise`` on ``curve``, with every σ it evaluated."""
    seen: list[float] = []

    def epsilon(sigma):
        seen.append(sigma)
        return curve(sigma)

    return accounting.smallest_noise(epsilon, target, tolerance=tol, hint=hint), seen


_CURVES = {
    "power -1": lambda s: 3.0 / s,
    "power -2": lambda s: 3.0 / s**2,
    "steep then flat": lambda s: 50.0 * math.exp(-4.0 * s) + 0.2 / s,
    # a staircase: flat pieces and jumps, as a coarse discretisation can make it
    "staircase": lambda s: math.floor(400.0 / s) / 100.0,
    # zero beyond a point (an accountant that reports no loss) and infinite below another
    "zero and inf": lambda s: 0.0 if s > 4.0 else (math.inf if s < 0.05 else 2.0 / s),
}


@pytest.mark.parametrize("name", sorted(_CURVES))
@pytest.mark.parametrize("target", [0.3, 1.0, 8.0])
@pytest.mark.parametrize("hint", [None, 0.01, 1.3, 300.0])
def test_noise_search_brackets_the_crossing_within_tolerance(name, target, hint):
    """The answer's ε was evaluated within target, and an evaluated σ within tol below it was not."""
    curve = _CURVES[name]
    sigma, seen = _search(curve, target, hint)
    assert sigma in seen and curve(sigma) <= target
    below = [s for s in seen if s < sigma]
    assert below and curve(max(below)) > target and sigma / max(below) <= 1.0 + 1e-4 + 1e-12
    assert len(seen) <= 40


@pytest.mark.parametrize("exponent", [1.0, 1.5, 2.0, 3.0])
def test_noise_search_takes_few_evaluations_on_a_smooth_curve(exponent):
    """ε close to a power law in σ (as the accountants' are near the target): interpolation finds the
    crossing in a handful of evaluations, from a hint 20 % off or from no hint at all."""
    def curve(s):
        return 2.0 * s ** -exponent * (1.0 + 0.05 * math.log(s) ** 2)

    root, _ = _search(curve, 1.5, tol=1e-12)
    for hint in (None, 1.2 * root, root / 1.2):
        sigma, seen = _search(curve, 1.5, hint)
        assert sigma == pytest.approx(root, rel=1e-4)
        assert len(seen) <= 6, (hint, seen)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=-1.0), "target_epsilon"),
        (dict(target_epsilon=math.inf), "target_epsilon"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(events_shape=[(0.0, 10)]), "sample_rate"),
        (dict(events_shape=[(1.5, 10)]), "sample_rate"),
        (dict(events_shape=[]), "events_shape"),
        (dict(events_shape=[(0.1, 0)]), "no steps"),
        (dict(sigma_schedule=[1.0, 0.5]), "sigma_schedule"),
        (dict(sigma_schedule=[0.0]), "sigma_schedule"),
        (dict(accountant="moments"), "accountant"),
        (dict(tolerance=0.0), "tolerance"),
    ],
)
def test_calibration_rejects_bad_input(kwargs, match):
    args = dict(target_epsilon=8.0, delta=DELTA, events_shape=[(0.01, 100)], accountant="rdp")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(**args)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_a_target_no_noise_multiplier_in_range_meets_is_an_input_error(accountant):
    # ε = 1e9 for one Gaussian release: the search goes down in σ until the accountant gives up, at
    # once and with an input error (a config mistake: one line and exit 2 from the command line).
    with pytest.raises(AccountingError) as got:
        calibrate_noise_multiplier(1e9, DELTA, [(1.0, 1)], accountant)
    assert isinstance(got.value, ConfigError)
    assert "1e+09" in str(got.value)
    with pytest.raises(AccountingError, match="no noise multiplier up to"):
        calibrate_noise_multiplier(1e-9, 1e-12, [(1.0, 1)], accountant)


def test_pld_refuses_a_noise_multiplier_too_small_to_build_and_names_rdp():
    # σ = 0.03: about 1.8e6 points in one step's loss distribution (8 s and more a step to build);
    # ε is in the thousands, which the RDP accountant answers at once.
    with pytest.raises(AccountingError, match="rdp accountant"):
        compute_epsilon_steps(0.1, 0.03, 10, DELTA, "pld")
    assert 1000.0 < compute_epsilon_steps(0.1, 0.03, 10, DELTA, "rdp") < math.inf
    # Just above the limit's σ the PLD still answers, below RDP's bound.
    sigma = 0.06
    assert accounting._pld_points(sigma, accounting.pld_discretization_interval([StepEvent(1.0, sigma, 1)])) \
        <= accounting.PLD_MAX_POINTS
    assert compute_epsilon_steps(1.0, sigma, 1, DELTA, "pld") < compute_epsilon_steps(1.0, sigma, 1, DELTA, "rdp")


def test_pld_out_of_memory_is_an_input_error_that_names_rdp(monkeypatch):
    def too_big(*args):
        raise MemoryError("Unable to allocate 281. TiB")
    monkeypatch.setattr(accounting, "_event_pld", too_big)
    with pytest.raises(AccountingError, match="ran out of memory composing 10 steps.*rdp accountant"):
        compute_epsilon_steps(0.1, 0.5, 10, DELTA, "pld")


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
@pytest.mark.parametrize("sigma", [1e-300, 5e-5, 2e6, 1e300])
def test_a_noise_multiplier_outside_the_accountants_range_is_an_input_error(accountant, sigma):
    with pytest.raises(AccountingError, match="outside"):
        compute_epsilon_steps(0.1, sigma, 10, DELTA, accountant)


# ---------------------------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------------------------


def test_ledger_merges_equal_events():
    ledger = PrivacyLedger(DELTA, "rdp")
    for _ in range(3):
        ledger.record(StepEvent(0.01, 1.0, 70))
        ledger.record(StepEvent(1.0, 10.0, 1))  # a noised side channel each round
    ledger.record(StepEvent(0.01, 1.0, 0))
    # Equal subsampled events add their counts; the plain Gaussian releases (q = 1) compose exactly
    # into one Gaussian with σ = 10/√3 (μ-GDP), placed last.
    (sampled, plain) = ledger.events
    assert sampled == StepEvent(0.01, 1.0, 210)
    assert (plain.sample_rate, plain.count) == (1.0, 1) and plain.noise_multiplier == pytest.approx(10.0 / math.sqrt(3))
    separate = compute_epsilon([StepEvent(0.01, 1.0, 210)] + [StepEvent(1.0, 10.0, 1)] * 3, DELTA, "rdp")
    assert ledger.epsilon() == pytest.approx(separate, rel=1e-9)
    # ...which is what dp_accounting gives for the three releases composed one by one.
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 210)
    acc.compose(dp_accounting.GaussianDpEvent(10.0), 3)
    assert ledger.epsilon() == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize("accountant, rel", [("pld", 1e-2), ("rdp", 1e-6)])
def test_ledger_composes_like_dp_accounting(accountant, rel):
    events = [StepEvent(0.01, 1.0, 500), StepEvent(1.0, 10.0, 1), StepEvent(0.02, 1.5, 300)]
    ledger = PrivacyLedger(DELTA, accountant)
    for event in events:
        ledger.record(event)
    direct = dp_accounting.ComposedDpEvent(
        [_poisson_gaussian(0.01, 1.0, 500), dp_accounting.GaussianDpEvent(10.0), _poisson_gaussian(0.02, 1.5, 300)]
    )
    assert ledger.epsilon() == pytest.approx(_reference(direct, accountant), rel=rel)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_ledger_incremental_equals_from_scratch(accountant):
    ledger = PrivacyLedger(DELTA, accountant)
    history = []
    for server_round in range(3):
        for event in (StepEvent(0.0128, 1.0, 70), StepEvent(1.0, 20.0, 1), StepEvent(0.0128, 1.2 * 0.9**server_round, 5)):
            ledger.record(event)
            history.append(event)
        assert ledger.epsilon() == pytest.approx(compute_epsilon(history, DELTA, accountant), rel=1e-4)
    # a newly needed finer PLD interval (5e-4) restarts the composition rather than mixing intervals
    ledger.record(StepEvent(0.004, 1.5, 10))
    history.append(StepEvent(0.004, 1.5, 10))
    assert ledger.epsilon() == pytest.approx(compute_epsilon(history, DELTA, accountant), rel=1e-4)


def test_ledger_caches_until_record(monkeypatch):
    calls = []
    real = accounting._compose
    monkeypatch.setattr(accounting, "_compose", lambda acc, events: (calls.append(events), real(acc, events)))
    ledger = PrivacyLedger(DELTA, "rdp")
    assert ledger.epsilon() == 0.0
    ledger.record(StepEvent(0.02, 1.0, 100))
    first = ledger.epsilon()
    assert ledger.epsilon() == first
    assert len(calls) == 1
    ledger.record(StepEvent(0.02, 1.0, 100))
    second = ledger.epsilon()
    assert len(calls) == 2
    # only the new steps were composed
    assert list(calls[-1]) == [StepEvent(0.02, 1.0, 100)]
    assert second > first
    assert second == pytest.approx(compute_epsilon_steps(0.02, 1.0, 200, DELTA, "rdp"), rel=1e-9)


def test_ledger_infinite_without_noise():
    ledger = PrivacyLedger(DELTA)
    ledger.record(StepEvent(0.02, 1.0, 10))
    ledger.record(StepEvent(1.0, 0.0, 1))
    assert ledger.epsilon() == math.inf


def test_ledger_rejects_bad_arguments():
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(0.0)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyLedger(DELTA, "nope")
    with pytest.raises(ValueError, match="StepEvent"):
        PrivacyLedger(DELTA).record((0.1, 1.0, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_epsilon_many_dedups_and_matches(monkeypatch, accountant):
    calls = []
    real = PrivacyLedger._evaluate
    monkeypatch.setattr(PrivacyLedger, "_evaluate", lambda self: (calls.append(self.events), real(self))[1])
    rates = [0.01] * 7 + [0.02] * 3
    ledgers = [PrivacyLedger(DELTA, accountant) for _ in rates]
    for server_round in range(2):
        for ledger, q in zip(ledgers, rates):
            ledger.record(StepEvent(q, 1.0, 70))
            ledger.record(StepEvent(1.0, 20.0, 1))
        calls.clear()
        values = epsilon_many(ledgers)
        assert len(calls) == 2  # one evaluation per distinct ledger content
        expected = {
            q: compute_epsilon([StepEvent(q, 1.0, 70 * (server_round + 1)), StepEvent(1.0, 20.0, server_round + 1)],
                               DELTA, accountant)
            for q in set(rates)
        }
        assert values == [pytest.approx(expected[q], rel=1e-4) for q in rates]
    # ledgers that shared an evaluation stay independent afterwards
    ledgers[1].record(StepEvent(0.01, 1.0, 70))
    assert ledgers[1].epsilon() > ledgers[0].epsilon()
    assert ledgers[0].epsilon() == pytest.approx(expected[0.01], rel=1e-4)
    assert ledgers[1].epsilon() == pytest.approx(
        compute_epsilon([StepEvent(0.01, 1.0, 210), StepEvent(1.0, 20.0, 2)], DELTA, accountant), rel=1e-4
    )


def test_epsilon_many_empty():
    assert epsilon_many([]) == []


def test_cached_event_plds_compose_to_the_uncached_bits():
    """The PLD accountant reuses each event's PLD across rounds; the result must equal building them afresh."""
    from raysim.privacy.accounting import PLDAccountant
    rounds = [[StepEvent(0.07, 0.9, 14), StepEvent(1.0, 25.0, 3)], [StepEvent(0.07, 0.9, 14)]]
    for disc in (1e-3, 5e-4):
        cached, fresh = PLDAccountant(disc), PLDAccountant(disc, cache=False)
        for events in rounds + rounds:
            for e in events:
                cached.compose(e)
                fresh.compose(e)
            assert cached.epsilon(1e-5) == fresh.epsilon(1e-5)
            assert cached.delta(1.0) == fresh.delta(1.0)
