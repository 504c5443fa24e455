"""Which uploads a privacy unit's ε covers: only the release kinds its ledger accounts; every other upload
needs an opt-in by name, under any unit, one that raysim does not know included."""

from __future__ import annotations

import pytest

from raysim.algorithms.registry import all_methods, get_method, resolve_preset
from raysim.algorithms.uploads import (ACCOUNTED, RELEASE_KINDS, Release, Upload, check_uncovered, not_covered_text,
                                       uncovered_keys)
from raysim.config import ConfigError
from raysim.privacy.plan import epsilon_exceptions, not_covered, resolve_clipping
from tests.helpers import tiny_config


def _upload(kind: str, name: str = "") -> Upload:
    release = Release(kind, 2.0) if kind == "gaussian" else Release(kind)
    return Upload(name or f"{kind}_value", f"a {kind} value", lambda ctx: 0.0, release)


UPLOADS = tuple(_upload(kind) for kind in RELEASE_KINDS)


@pytest.mark.parametrize("unit, covered", [
    ("example", {"gaussian_value", "post_processing_value", "diagnostic_value"}),
    ("client", {"joint_value", "diagnostic_value"}),
    ("household", {"diagnostic_value"}),          # a unit without a ledger entry accounts no upload
])
def test_an_upload_is_covered_only_if_the_units_ledger_accounts_it(unit, covered):
    keys = uncovered_keys(UPLOADS, "update", unit)
    assert set(keys) == {u.name for u in UPLOADS} - covered
    assert uncovered_keys(UPLOADS, "none", unit) == ()      # without DP nothing is claimed
    with pytest.raises(ConfigError, match=rf"opt in with privacy.allow_uncovered: \[{', '.join(keys)}\]$"):
        check_uncovered(UPLOADS, "update", unit, ())
    assert check_uncovered(UPLOADS, "update", unit, keys) == keys
    text = not_covered_text(UPLOADS, "update", unit)
    assert all(k in text.split("logged by the simulation only")[0] for k in keys)
    assert "diagnostic_value" in text.split("logged by the simulation only")[1]


def test_the_refusal_says_why_in_one_line():
    with pytest.raises(ConfigError) as info:
        check_uncovered((_upload("post_processing", "norm"),), "update", "client", ())
    assert str(info.value) == (
        "this config uploads norm (a post_processing value) as a post_processing release, which privacy.unit=client "
        "does not account (its ledger accounts only joint uploads besides the update), so ε would not cover it; "
        "use its private default, or opt in with privacy.allow_uncovered: [norm]")
    assert set(ACCOUNTED) == {"example", "client"}


def test_the_client_units_log_list_names_what_the_simulation_keeps():
    text = not_covered_text((), "update", "client")
    assert text.startswith("logged by the simulation only, never released: ")
    for value in ("train_loss", "frac_clipped", "client_seconds", "mean_train_loss, client_train_seconds (rounds "
                  "table)", "update_norm", "participants, release_snr (rounds table)",
                  "which clients trained in each round"):
        assert value in text
    example = not_covered_text((), "per_sample", "example")
    assert example.startswith("logged by the simulation only, never uploaded: ") and "participants" not in example


@pytest.mark.parametrize("method", [s.name for s in all_methods() if "client" in s.units()])
def test_no_default_config_uploads_unaccounted_values_under_the_client_unit(method):
    spec = get_method(method)
    cfg = resolve_preset(tiny_config(method=method, privacy__unit="client", privacy__epsilon=8.0))
    if spec.client_level(cfg) is not None:   # FedDimDP: LLDM only under the client unit
        cfg = resolve_preset(tiny_config(method=method, privacy__unit="client", privacy__epsilon=8.0,
                                         feddimdp__adpc=False, feddimdp__cra=False))
    clipping = resolve_clipping(spec, cfg)
    assert epsilon_exceptions(spec, cfg, clipping) == ""
    assert not_covered(spec, cfg, clipping).startswith("logged by the simulation only, never released")
