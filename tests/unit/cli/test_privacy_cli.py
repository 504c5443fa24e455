"""``raysim privacy`` sub-commands, driven through a parser built here."""

from __future__ import annotations

import argparse
import json

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.cli import privacy
from raysim.privacy import accounting
from raysim.privacy.accounting import compute_epsilon_steps


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="raysim")
    privacy.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def _rdp_reference(q, sigma, steps, delta):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    return rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(delta)


OPACUS_RUN = ["--sample-rate", "0.04", "--steps", "2250", "--delta", "1e-5"]


def test_epsilon_plain(capsys):
    code, out = _run(["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "1.5", "--accountant", "rdp"], capsys)
    assert code == 0
    assert out.strip() == "epsilon = 7.3293 (delta=1e-05, accountant=rdp)"


def test_epsilon_json(capsys):
    code, out = _run(
        ["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "1.5", "--accountant", "rdp", "--json"], capsys
    )
    assert code == 0
    payload = json.loads(out)
    assert payload["epsilon"] == pytest.approx(_rdp_reference(0.04, 1.5, 2250, 1e-5), rel=1e-9)
    assert payload["epsilon"] == pytest.approx(7.3291, rel=1e-3)  # Opacus' known value
    assert payload["accountant"] == "rdp" and payload["delta"] == 1e-5 and payload["steps"] == 2250


def test_epsilon_defaults_to_pld(capsys):
    _, out = _run(["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "1.5", "--json"], capsys)
    payload = json.loads(out)
    assert payload["accountant"] == "pld"
    assert payload["epsilon"] == pytest.approx(compute_epsilon_steps(0.04, 1.5, 2250, 1e-5, "pld"), rel=1e-12)
    assert payload["epsilon"] < 7.3291  # PLD is tighter than RDP


def test_epsilon_without_noise_is_strict_json(capsys):
    _, out = _run(["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "0", "--json"], capsys)
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))["epsilon"] is None
    _, out = _run(["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "0"], capsys)
    assert out.startswith("epsilon = inf")


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrate_json(capsys, accountant):
    code, out = _run(
        ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "500", "--target-epsilon", "2",
         "--delta", "1e-5", "--accountant", accountant, "--json"],
        capsys,
    )
    assert code == 0
    payload = json.loads(out)
    sigma = payload["noise_multiplier"]
    assert compute_epsilon_steps(0.01, sigma, 500, 1e-5, accountant) <= 2.0
    assert compute_epsilon_steps(0.01, 0.99 * sigma, 500, 1e-5, accountant) > 2.0
    assert payload["epsilon"] <= 2.0
    if accountant == "rdp":
        assert _rdp_reference(0.01, sigma, 500, 1e-5) == pytest.approx(2.0, rel=1e-3)


def test_calibrate_plain_prints_a_sigma_that_stays_under_target(capsys):
    code, out = _run(
        ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "500", "--target-epsilon", "2",
         "--delta", "1e-5", "--accountant", "rdp"],
        capsys,
    )
    assert code == 0
    assert out.startswith("noise_multiplier = ")
    printed = float(out.split()[2])
    assert compute_epsilon_steps(0.01, printed, 500, 1e-5, "rdp") <= 2.0


@pytest.mark.parametrize(
    "argv, match",
    [
        (["epsilon", "--sample-rate", "0", "--steps", "10", "--delta", "1e-5", "--noise-multiplier", "1"], "sample-rate"),
        (["epsilon", "--sample-rate", "1.5", "--steps", "10", "--delta", "1e-5", "--noise-multiplier", "1"], "sample-rate"),
        (["epsilon", "--sample-rate", "0.1", "--steps", "0", "--delta", "1e-5", "--noise-multiplier", "1"], "steps"),
        (["epsilon", "--sample-rate", "0.1", "--steps", "10", "--delta", "0", "--noise-multiplier", "1"], "delta"),
        (["epsilon", "--sample-rate", "0.1", "--steps", "10", "--delta", "1", "--noise-multiplier", "1"], "delta"),
        (["epsilon", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5", "--noise-multiplier", "-1"], "noise-multiplier"),
        (["calibrate", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5", "--target-epsilon", "0"], "target-epsilon"),
        (["calibrate", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5", "--target-epsilon", "-2"], "target-epsilon"),
    ],
)
def test_bad_values_raise_value_error(capsys, argv, match):
    with pytest.raises(ValueError, match=match) as info:
        _run(["privacy", *argv], capsys)
    assert "\n" not in str(info.value)


def test_unknown_accountant_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        _run(["privacy", "epsilon", *OPACUS_RUN, "--noise-multiplier", "1", "--accountant", "gdp"], capsys)
    assert info.value.code == 2


def test_privacy_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        _run(["privacy"], capsys)
    assert info.value.code == 2


def test_accountant_choices_are_the_accountants():
    # the CLI spells them out so that building the parser does not import dp_accounting
    assert privacy.ACCOUNTANTS == accounting.ACCOUNTANTS


@pytest.mark.parametrize("argv, match", [
    (["calibrate", "--target-epsilon", "1e9", "--accountant", "rdp"], "too loose"),
    (["epsilon", "--noise-multiplier", "1e-300"], "outside"),
    (["epsilon", "--noise-multiplier", "0.001"], "rdp accountant"),
])
def test_requests_the_accountant_cannot_answer_are_one_line_input_errors(argv, match, capsys):
    from raysim.cli import main
    run = ["--sample-rate", "1", "--steps", "1", "--delta", "1e-5"]
    assert main(["privacy", *argv[:1], *run, *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim: error: ") and match in err and "\n" not in err
