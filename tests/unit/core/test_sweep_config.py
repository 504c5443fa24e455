"""Sweep files: expansion, precedence, validation, presets, the cluster YAML. No Ray."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from raysim.cli import main
from raysim.config import ConfigError
from raysim.run_plan import run_id_for
from raysim.results import ResultsSink
from raysim.sweep import check_sweep, expand_sweep, load_sweep

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "experiments" / "sweeps" / "smoke.yaml"

BASE = {"rounds": 2, "num_clients": 4, "data": {"name": "digits", "min_samples_per_client": 20}}


def _expand(grid, overrides=None, base=None, cli=()):
    spec = {"base": BASE if base is None else base, "grid": grid}
    if overrides is not None:
        spec["overrides"] = overrides
    return expand_sweep(spec, name="t", overrides=list(cli))


def test_smoke_preset_expands_to_four_runs_with_sigma_only_for_fedsa():
    sweep = load_sweep(SMOKE)
    got = [(c.method, c.data.alpha, c.seed, c.privacy.noise_multiplier, c.rounds) for c in sweep.configs]
    assert got == [("fedavg", 0.3, 0, None, 2), ("fedavg", 0.1, 0, None, 2),
                   ("fedsa", 0.3, 0, 1.0, 2), ("fedsa", 0.1, 0, 1.0, 2)]
    assert all(c.data.name == "digits" and c.data.root is None for c in sweep.configs)
    assert sweep.sweep_id.startswith("smoke-") and len(set(sweep.run_ids)) == 4
    check_sweep(sweep)


def test_precedence_base_then_set_then_grid_then_overrides():
    sweep = _expand({"method": ["fedavg", "fedsa"]},
                    overrides=[{"when": {"method": "fedsa"}, "set": {"privacy.noise_multiplier": 2.0, "lr": 0.5}}],
                    cli=[("lr", 0.2), ("privacy.clip_norm", 3.0)])
    fedavg, fedsa = sweep.configs
    assert (fedavg.lr, fedavg.privacy.clip_norm, fedavg.privacy.noise_multiplier) == (0.2, 3.0, None)
    assert (fedsa.lr, fedsa.privacy.clip_norm, fedsa.privacy.noise_multiplier) == (0.5, 3.0, 2.0)


def test_mapping_values_merge_key_by_key():
    sweep = _expand({"data": [{"alpha": 0.2}, {"partition": "iid"}]})
    a, b = sweep.configs
    assert (a.data.name, a.data.alpha, a.data.min_samples_per_client) == ("digits", 0.2, 20)
    assert (b.data.name, b.data.partition) == ("digits", "iid")


def test_sweep_id_ignores_runtime_paths_and_key_order_but_not_results():
    grid = {"method": ["fedavg"], "seed": [0, 1]}
    one = _expand(grid)
    assert _expand(dict(reversed(grid.items()))).sweep_id == one.sweep_id
    assert _expand(grid, cli=[("runtime.num_actors", 2), ("data.root", "/x")]).sweep_id == one.sweep_id
    assert _expand(grid, cli=[("rounds", 3)]).sweep_id != one.sweep_id
    assert one.run_ids == tuple(run_id_for(c) for c in one.configs)


def test_points_that_resolve_to_the_same_run_are_merged():
    sweep = _expand({"data.partition": ["iid", "dirichlet"], "data.alpha": [0.3, 0.1]},
                    overrides=[{"when": {"data.partition": "iid"}, "set": {"data.alpha": 0.3}}])
    assert len(sweep.configs) == 3 and sweep.duplicates == 1


def test_when_accepts_a_list_and_defaults():
    # lr is not in the base: `when` falls back to the Config default (0.01)
    sweep = _expand({"method": ["fedavg", "fedsa", "feddimdp"]},
                    overrides=[{"when": {"method": ["fedsa", "feddimdp"], "lr": 0.01},
                                "set": {"privacy.noise_multiplier": 1.0}}])
    assert [c.privacy.noise_multiplier for c in sweep.configs] == [None, 1.0, 1.0]


@pytest.mark.parametrize("spec_change, message", [
    ({"grid": {"data.alpah": [0.1]}}, "data.alpah"),
    ({"grid": {"seed": 3}}, "non-empty list"),
    ({"grid": {}}, "grid"),
    ({"grdi": {"seed": [0]}}, "grdi"),
    ({"overrides": [{"when": {"method": "fedsaa"}, "set": {"lr": 0.1}}]}, "matches no grid point"),
    ({"overrides": [{"when": {"privacy.eps": 1}, "set": {"lr": 0.1}}]}, "privacy.eps"),
    ({"overrides": [{"when": {"method": "fedavg"}, "set": {"lr": -1}}]}, "lr"),
    ({"overrides": [{"when": {"method": "fedavg"}}]}, "`when` and `set`"),
    ({"base": {"method": ["fedavg", "fedsa"]}}, "grid.method"),
])
def test_bad_sweep_files_raise_one_line_config_errors(spec_change, message):
    spec = {"base": BASE, "grid": {"method": ["fedavg"]}, **spec_change}
    with pytest.raises(ConfigError, match=None) as info:
        expand_sweep(spec, name="t")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_set_may_not_name_a_grid_key():
    with pytest.raises(ConfigError, match="grid key"):
        _expand({"seed": [0, 1]}, cli=[("seed", 4)])


def test_check_sweep_names_the_run_that_cannot_start():
    sweep = _expand({"method": ["fedavg", "fedsa"]})   # fedsa without σ or ε
    with pytest.raises(ConfigError, match=r"fedsa digits .*needs privacy.epsilon"):
        check_sweep(sweep)


def test_base_may_be_a_config_file_relative_to_the_sweep(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "base.yaml").write_text(yaml.safe_dump({**BASE, "lr": 0.3}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"base": "cfg/base.yaml", "grid": {"seed": [0, 1]}}))
    sweep = load_sweep(tmp_path / "s.yaml", data_root="data", address="ray://h:10001")
    assert sweep.name == "s" and [c.lr for c in sweep.configs] == [0.3, 0.3]
    assert sweep.configs[0].data.root == str(Path("data").resolve())
    assert sweep.configs[0].runtime.address == "ray://h:10001"


def test_table1_preset_follows_spec_settings():
    sweep = load_sweep(REPO / "experiments" / "paper" / "table1.yaml", data_root="/data")
    assert len(sweep.configs) == 10 * (2 + 1 + 2) * 3 and sweep.duplicates == 10 * 3
    for c in sweep.configs:
        assert (c.num_clients, c.local_epochs, c.batch_size, c.lr, c.rounds, c.privacy.delta) == (10, 1, 64, 0.01, 100, 1e-5)
        assert c.privacy.epsilon == (None if c.method == "fedavg" else 8.0)
        assert c.data.partition == ("shards" if c.data.name == "svhn" else "dirichlet")
        assert c.data.root == "/data"
    assert {c.method for c in sweep.configs} >= {"fedsa", "dp-fedsam", "dp-acdn", "fedacg", "awdp-fl", "feddimdp"}
    assert {(c.data.name, c.data.alpha) for c in sweep.configs if c.data.partition == "dirichlet"} == {
        (d, a) for d in ("cifar10", "stl10") for a in (0.3, 0.1)}


def test_table2_preset_shares_its_feddimdp_runs_with_table1():
    t1 = load_sweep(REPO / "experiments" / "paper" / "table1.yaml")
    t2 = load_sweep(REPO / "experiments" / "paper" / "table2.yaml")
    assert {c.method for c in t2.configs} == {"feddimdp", "feddimdp-no-cra", "feddimdp-no-adpc", "feddimdp-no-lldm"}
    assert len(t2.configs) == 4 * 5 * 3
    shared = set(t1.run_ids) & set(t2.run_ids)
    assert len(shared) == 15 and all(r.startswith("feddimdp-") for r in shared)


def test_cli_dry_run_lists_status_and_bad_key_exits_2(tmp_path, capsys):
    sweep = load_sweep(SMOKE)
    done = sweep.run_ids[1]
    ResultsSink(str(tmp_path)).write_run({"run_id": done, "status": "completed"})
    assert main(["sweep", str(SMOKE), "--results-dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 runs, 1 already completed, 3 to run" in out
    assert f"completed  {done}" in out and out.count("new ") == 3
    assert main(["sweep", str(SMOKE), "--results-dir", str(tmp_path), "--set", "data.alpah=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim: error:") and "data.alpah" in err and "\n" not in err
    assert main(["sweep", str(SMOKE), "--results-dir", str(tmp_path), "--max-concurrent", "0"]) == 2


def test_cluster_yaml_is_valid_for_ray_up():
    jsonschema = pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed")
    schema = json.loads((Path(list(spec.submodule_search_locations)[0]) / "autoscaler" / "ray-schema.json").read_text())
    cluster = yaml.safe_load((REPO / "experiments" / "cluster" / "cluster.yaml").read_text())
    jsonschema.validate(cluster, schema)
    types = cluster["available_node_types"]
    gpu = [t for t in types.values() if t.get("resources", {}).get("GPU", 0) > 0]
    cpu = [name for name, t in types.items() if name != cluster["head_node_type"] and not t.get("resources", {}).get("GPU")]
    assert gpu and cpu


# A preset's switches are unset in the config as written; the run resolves them before it is checked, and so
# must a sweep or a tune, or an unset switch reads as on.
PRESET_CASES = [("feddimdp-no-adpc", {"privacy.clipping": "batch"}),
                ("feddimdp-no-cra", {"cra.private_val_f1": False})]


@pytest.mark.parametrize("method, sets", PRESET_CASES)
def test_a_sweep_accepts_the_preset_configs_that_a_run_accepts(method, sets):
    from raysim.run_plan import plan_run
    sweep = _expand({"method": [method], "seed": [0, 1]}, base={**BASE, "privacy": {"epsilon": 8.0}},
                    cli=list(sets.items()))
    check_sweep(sweep)
    for cfg in sweep.configs:
        plan = plan_run(cfg)
        assert plan.cfg.feddimdp.on("adpc" if method.endswith("adpc") else "cra") is False
        assert plan.clipping == sets.get("privacy.clipping", "per_sample")


@pytest.mark.parametrize("method, sets", PRESET_CASES)
def test_a_tune_accepts_the_preset_configs_that_a_run_accepts(tmp_path, capsys, method, sets):
    spec = {"base": {**BASE, "privacy": {"epsilon": 8.0}, "data": {**BASE["data"], "server_holdout": 100}},
            "methods": [{"method": method, "set": sets}], "space": {"lr": [0.05, 0.1]},
            "tuning_seeds": [10], "final_seeds": [0, 1]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["tune", str(path), "--results-dir", str(tmp_path / "r"), "--dry-run"]) == 0
    assert "search: 2 runs, 0 done, 2 to run" in capsys.readouterr().out


def test_a_sweep_still_refuses_a_preset_switch_set_against_the_preset():
    with pytest.raises(ConfigError, match="feddimdp-no-adpc.*is the preset feddimdp.adpc=False"):
        _expand({"method": ["feddimdp-no-adpc"]}, base={**BASE, "privacy": {"epsilon": 8.0}},
                cli=[("feddimdp.adpc", True)])
