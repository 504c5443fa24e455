from __future__ import annotations

import pytest

from raysim.config import ConfigError, apply_overrides, config_from_dict, config_hash, parse_override


def test_defaults_are_valid_and_frozen():
    cfg = config_from_dict({})
    with pytest.raises(Exception):
        cfg.rounds = 3  # type: ignore[misc]


@pytest.mark.parametrize("values, fragment", [
    ({"bogus": 1}, "'bogus': unknown key"),
    ({"data": {"alpah": 0.3}}, "'data.alpah': unknown key"),
    ({"data": {"alpha": 0.0}}, "'data.alpha': must be > 0"),
    ({"data": {"alpha": -1}}, "'data.alpha': must be > 0"),
    ({"rounds": 0}, "'rounds': must be >= 1"),
    ({"rounds": 2.5}, "'rounds': expected an integer"),
    ({"momentum": 1.0}, "'momentum': must be in [0, 1)"),
    ({"momentum": -0.1}, "'momentum': must be in [0, 1)"),
    ({"privacy": {"epsilon": 8, "noise_multiplier": 1.0}}, "not both"),
    ({"privacy": {"epsilon": None, "noise_multiplier": 1e-300}}, "must be 0 (no noise) or in [0.0001, 1e+06]"),
    ({"privacy": {"epsilon": None, "noise_multiplier": 1e7}}, "'privacy.noise_multiplier'"),
    ({"privacy": {"clipping": "sometimes"}}, "unknown value 'sometimes'"),
    ({"data": {"partition": "zipf"}}, "'data.partition'"),
    ({"cra": {"rho": 0.5}}, "'cra.rho'"),
    ({"data": {"test_subsample": 0}}, "'data.test_subsample': must be >= 1"),
    ({"cra": {"eta_p": -1}}, "'cra.eta_p': must be >= 0"),
    ({"cra": {"eta_g": 0}}, "'cra.eta_g': must be > 0"),
    # A zero σ or sensitivity would upload q_i un-noised under a Gaussian release's label.
    ({"cra": {"val_f1_noise_multiplier": 0}}, "'cra.val_f1_noise_multiplier': must be > 0"),
    ({"cra": {"val_f1_sensitivity": 0}}, "'cra.val_f1_sensitivity': must be >= 1"),
    ({"cra": {"val_f1_sensitivity": 0.5}}, "'cra.val_f1_sensitivity': must be >= 1"),
    ({"model": "resnet50"}, "'model': unknown value 'resnet50'; choose one of cnn, small_cnn, resnet18_gn, wrn16_4"),
])
def test_bad_values_name_the_key(values, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        config_from_dict(values)
    assert fragment in str(err.value)


def test_overrides_parse_yaml_values():
    assert parse_override("privacy.epsilon=8") == ("privacy.epsilon", 8)
    assert parse_override("privacy.epsilon=null") == ("privacy.epsilon", None)
    assert parse_override("method=[a, b]") == ("method", ["a", "b"])
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")
    values = apply_overrides({"data": {"alpha": 0.3}}, [("data.alpha", 0.1), ("seed", 3)])
    assert values == {"data": {"alpha": 0.1}, "seed": 3}


def test_hash_is_stable_and_sensitive():
    a = config_from_dict({"seed": 1, "data": {"alpha": 0.3}})
    b = config_from_dict({"data": {"alpha": 0.3}, "seed": 1})
    c = config_from_dict({"seed": 2, "data": {"alpha": 0.3}})
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_result_hash_covers_every_key_that_changes_results_and_no_other():
    from raysim.run_plan import run_id_for as result_hash   # the hash of the sections the run uses

    base = config_from_dict({"rounds": 3})
    same = [{"runtime": {"executor": "serial"}}, {"runtime": {"num_actors": 3}}, {"runtime": {"eval_on": "actor"}},
            {"runtime": {"malloc_tuning": False}}, {"runtime": {"checkpoint_every": 0}},
            {"data": {"root": "/elsewhere", "cache_dir": "/tmp/c"}}]
    for change in same:
        assert result_hash(config_from_dict({"rounds": 3, **change})) == result_hash(base), change
    moved = [{"model": "wrn16_4"}, {"eval_every": 2}, {"replicate": 1}, {"participation": "poisson"},
             {"clients_per_round": 5}, {"runtime": {"torch_threads": 2}}, {"data": {"alpha": 0.1}},
             {"cra": {"utility": "server_val_f1"}}]   # a public hold-out for any method: another partition
    hashes = {result_hash(config_from_dict({"rounds": 3, **change})) for change in moved}
    assert len(hashes) == len(moved) and result_hash(base) not in hashes
    # a method section counts for the method that uses it, and only then
    assert result_hash(config_from_dict({"rounds": 3, "sam": {"rho": 0.1}})) == result_hash(base)
    dimdp = config_from_dict({"rounds": 3, "method": "feddimdp"})
    for change in ({"adpc": {"c0": 2.0}}, {"cra": {"rho": 2.0}}, {"lldm": {"reduction": 0.25}}):
        assert result_hash(config_from_dict({"rounds": 3, "method": "feddimdp", **change})) != result_hash(dimdp)
        off = {"feddimdp": {next(iter(change)): False}}
        assert (result_hash(config_from_dict({"rounds": 3, "method": "feddimdp", **off, **change}))
                == result_hash(config_from_dict({"rounds": 3, "method": "feddimdp", **off})))


def test_a_preset_method_has_one_run_id_before_and_after_its_switches_are_resolved():
    """Sweeps and tunes find a run's row by the id of the config they planned (preset unresolved); the run
    writes it under the id of the config it ran (resolved). The two must agree, or a completed run reruns."""
    from raysim.algorithms.registry import all_methods, resolve_preset
    from raysim.run_plan import run_id_for
    presets = [spec.name for spec in all_methods() if spec.preset]
    assert presets
    for name in presets:
        cfg = config_from_dict({"method": name, "privacy": {"epsilon": 8.0}})
        assert resolve_preset(cfg) != cfg
        assert run_id_for(cfg) == run_id_for(resolve_preset(cfg)), name
