"""FedDimDP checked from the values a real (serial) run logs."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from raysim.algorithms.registry import get_method, resolve_preset
from raysim.config import ConfigError
from raysim.runtime import execute
from raysim.results import read_table
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation

COLUMNS = ["update_norm", "update_norm_per_step", "val_f1", "val_f1_ema", "update_norm_ema", "reliability",
           "nominal_weight", "deviation", "deviation_normalized", "robust_weight", "clip_norm", "frac_clipped",
           "epsilon", "example_norm_median", "example_norm_median_true"]


def _run(tmp_path_factory, method: str, rounds: int = 2, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = tmp_path_factory.mktemp(method)
    kw.setdefault("privacy__noise_multiplier", 1.0)   # σ given: calibration is tested elsewhere
    execute(tiny_config(method=method, rounds=rounds, **kw), str(folder))
    clients = read_table(str(folder), "clients").sort_values(["round", "client_id"]).reset_index(drop=True)
    rounds_ = read_table(str(folder), "rounds").sort_values("round").reset_index(drop=True)
    return rounds_, clients


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {m: _run(tmp_path_factory, m) for m in ("feddimdp", "feddimdp-no-adpc", "feddimdp-no-cra")}


def _median(x: np.ndarray) -> float:
    x = np.sort(x)
    n = len(x)
    return float(x[n // 2]) if n % 2 else float((x[n // 2 - 1] + x[n // 2]) / 2)


def test_every_column_is_logged(runs):
    rounds, clients = runs["feddimdp"]
    assert list(rounds["round"]) == [1, 2]
    assert clients[COLUMNS].notna().all().all()
    assert rounds[["clip_norm", "epsilon"]].notna().all().all()


def test_next_clip_is_max_of_median_of_private_medians_and_floor(tmp_path_factory):
    rounds, clients = _run(tmp_path_factory, "feddimdp", rounds=3, adpc__read="per_client")
    for t in (1, 2):
        m = clients.loc[clients["round"] == t, "example_norm_median"].to_numpy()
        expected = max(_median(m), 0.1)
        assert rounds.loc[rounds["round"] == t + 1, "clip_norm"].item() == pytest.approx(expected, rel=1e-12)
        assert (clients.loc[clients["round"] == t + 1, "clip_norm"] == expected).all()
    assert rounds.loc[0, "clip_norm"] == 1.0   # C^(0) = adpc.c0
    # The private median tracks the true one (both logged; only the former was uploaded).
    c = clients[["example_norm_median", "example_norm_median_true"]].to_numpy()
    assert np.all(np.abs(np.log(c[:, 0] / c[:, 1])) < np.log(3.0))


@pytest.mark.parametrize("statistic", ["update_norm", "update_norm_per_step", "update_norm_denoised"])
def test_literal_statistics(tmp_path_factory, statistic):
    # adpc.read (pooled by default) reads histograms; one number per client is always read as the median
    rounds, clients = _run(tmp_path_factory, "feddimdp", adpc__statistic=statistic)
    g = clients[clients["round"] == 1]
    column = "update_norm_per_step" if statistic == "update_norm_per_step" else statistic
    assert rounds.loc[1, "clip_norm"] == pytest.approx(max(_median(g[column].to_numpy()), 0.1), rel=1e-12)
    assert g["example_norm_median"].isna().all() and g["example_norm_median_true"].isna().all()


def test_robust_weights_lie_in_the_ambiguity_set(runs):
    _, clients = runs["feddimdp"]
    for _, g in clients.groupby("round"):
        p, alpha = g["robust_weight"].to_numpy(), g["nominal_weight"].to_numpy()
        assert p.sum() == pytest.approx(1.0, abs=1e-9)
        assert (p >= -1e-12).all() and (p <= 1.5 * alpha + 1e-9).all()
        assert np.allclose(g["aggregation_weight"], p)


def test_presets_set_exactly_their_switch():
    for name, switch in (("feddimdp-no-lldm", "lldm"), ("feddimdp-no-adpc", "adpc"), ("feddimdp-no-cra", "cra")):
        cfg = resolve_preset(tiny_config(method=name))
        assert getattr(cfg.feddimdp, switch) is False
        assert sum(cfg.feddimdp.on(s) for s in ("lldm", "adpc", "cra")) == 2
        assert get_method(name).server is get_method("feddimdp").server
    with pytest.raises(ConfigError, match="preset feddimdp.adpc=False"):
        resolve_preset(tiny_config(method="feddimdp-no-adpc", feddimdp__adpc=True))


def test_ablations_remove_exactly_their_component(runs):
    full_rounds, full_clients = runs["feddimdp"]
    # w/o-ADPC: C stays at privacy.clip_norm = C^(0), and no histogram is released, so at the same σ
    # each client spends less ε.
    r, c = runs["feddimdp-no-adpc"]
    assert (r["clip_norm"] == 1.0).all()
    assert c["example_norm_median"].isna().all()
    assert (c["epsilon"].to_numpy() < full_clients["epsilon"].to_numpy()).all()
    assert np.array_equal(c["num_samples"], full_clients["num_samples"])
    # w/o-CRA: FedAvg weights, no q_i uploaded.
    r, c = runs["feddimdp-no-cra"]
    g = c[c["round"] == 1]
    assert np.allclose(g["aggregation_weight"], g["num_samples"] / g["num_samples"].sum())
    assert g["val_f1"].isna().all() and g["robust_weight"].isna().all()
    f1 = full_clients[full_clients["round"] == 1]
    assert np.array_equal(g["update_norm"].to_numpy(), f1["update_norm"].to_numpy())
    assert r.loc[1, "clip_norm"] == pytest.approx(full_rounds.loc[1, "clip_norm"], rel=1e-12)


def test_all_switches_off_is_fedsa_bit_for_bit(tmp_path_factory):
    off = dict(feddimdp__lldm=False, feddimdp__adpc=False, feddimdp__cra=False)
    r_off, c_off = _run(tmp_path_factory, "feddimdp", **off)
    r_sa, c_sa = _run(tmp_path_factory, "fedsa")
    for col in ("test_accuracy", "test_loss", "test_f1", "epsilon", "clip_norm"):
        assert np.array_equal(r_off[col].to_numpy(), r_sa[col].to_numpy()), col
    for col in ("update_norm", "train_loss", "noise_multiplier", "epsilon", "aggregation_weight"):
        assert np.array_equal(c_off[col].to_numpy(), c_sa[col].to_numpy()), col


@pytest.mark.parametrize("lldm,adpc,cra", list(itertools.product([False, True], repeat=3)))
def test_every_switch_combination_runs(tmp_path, lldm, adpc, cra):
    cfg = tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, feddimdp__lldm=lldm, feddimdp__adpc=adpc,
                      feddimdp__cra=cra)
    execute(cfg, str(tmp_path))
    runs = read_table(str(tmp_path), "runs")
    assert runs["status"].tolist() == ["completed"] and np.isfinite(runs["epsilon"].item())
    clients = read_table(str(tmp_path), "clients")
    assert clients["example_norm_median"].notna().all() == adpc
    assert clients["val_f1"].notna().all() == cra
    assert ("norm_histogram" in runs["not_covered_by_epsilon"].item()) is False


def test_server_val_f1_scores_uploads_on_the_public_holdout(tmp_path_factory):
    r, c = _run(tmp_path_factory, "feddimdp", cra__utility="server_val_f1", data__server_holdout=100)
    assert c["val_f1"].between(0, 1).all() and c["robust_weight"].notna().all()
    folder = tmp_path_factory.mktemp("svf1")
    execute(tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, cra__utility="server_val_f1",
                               data__server_holdout=100), str(folder))
    runs = read_table(str(folder), "runs")
    assert "val_f1" not in runs["not_covered_by_epsilon"].item()   # post-processing on public data
    # The hold-out belongs to no client: 100 fewer training images in all.
    full = read_table(str(folder), "partitions")
    base = tmp_path_factory.mktemp("base")
    execute(tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0), str(base))
    part = read_table(str(base), "partitions")
    assert full["count"].sum() == part["count"].sum() - 100


def test_batch_clipping_with_the_default_statistic_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="update_norm\\|update_norm_per_step\\|update_norm_denoised"):
        execute(tiny_config(method="feddimdp", privacy__noise_multiplier=1.0, privacy__clipping="batch"), str(tmp_path))
    execute(tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, privacy__clipping="batch",
                               adpc__statistic="update_norm_denoised"), str(tmp_path))


@pytest.fixture(scope="module")
def adpc_options(tmp_path_factory):
    """Today's rule and each ADPC option alone, 3 rounds: the options change C or the step from round 2 on."""
    cases = {"legacy": ("per_client", "coupled"), "pooled": ("pooled", "coupled"), "normalized": ("per_client", "normalized")}
    return {name: _run(tmp_path_factory, "feddimdp", rounds=3, adpc__read=read, adpc__step=step)
            for name, (read, step) in cases.items()}


@pytest.mark.parametrize("option", ["pooled", "normalized"])
def test_adpc_options_run_at_the_same_privacy_cost(adpc_options, option):
    (r_base, c_base), (r, c) = adpc_options["legacy"], adpc_options[option]
    assert c[COLUMNS].notna().all().all() and np.isfinite(r["clip_norm"]).all()
    for col in ("epsilon", "noise_multiplier"):      # same releases, same σ: post-processing only
        assert np.array_equal(c[col].to_numpy(), c_base[col].to_numpy()), col
    assert np.array_equal(r["epsilon"].to_numpy(), r_base["epsilon"].to_numpy())
    # Round 1 trains at C^(0) with lr scale 1 under every option: the same updates bit for bit.
    first, first_base = c[c["round"] == 1], c_base[c_base["round"] == 1]
    assert np.array_equal(first["update_norm"].to_numpy(), first_base["update_norm"].to_numpy())


def test_pooled_read_sets_c_from_one_quantile_not_the_median_of_the_clients(adpc_options):
    r, c = adpc_options["pooled"]
    r_base, _ = adpc_options["legacy"]
    assert r.loc[1, "clip_norm"] != r_base.loc[1, "clip_norm"]
    assert (r["clip_norm"] >= 0.1).all()
    # Each client's own read is still logged, and with the same histograms it is the legacy run's.
    first = c[c["round"] == 1]["example_norm_median"].to_numpy()
    assert np.array_equal(first, adpc_options["legacy"][1].query("round == 1")["example_norm_median"].to_numpy())


def test_normalized_step_divides_the_step_by_c(adpc_options):
    r, c = adpc_options["normalized"]
    lr, c0 = 0.05, 1.0                                   # tiny_config's lr, adpc.c0
    scale = c0 / c["clip_norm"]
    per_step = c["update_norm"] / (lr * scale * c["num_steps"])
    np.testing.assert_allclose(c["update_norm_per_step"], per_step, rtol=1e-12)
    assert (c.loc[c["round"] > 1, "clip_norm"] != c0).all()   # C moved, so the scale was not 1
