from __future__ import annotations

import pytest

from raysim.config import ConfigError, apply_overrides, config_from_dict, config_hash, parse_override


def test_defaults_are_valid_and_frozen():
    cfg = config_from_dict({})
    assert cfg.privacy.delta == 1e-5 and cfg.adpc.c0 == 1.0 and cfg.cra.rho == 1.5
    with pytest.raises(Exception):
        cfg.rounds = 3  # type: ignore[misc]


@pytest.mark.parametrize("values, fragment", [
    ({"bogus": 1}, "'bogus': unknown key"),
    ({"data": {"alpah": 0.3}}, "'data.alpah': unknown key"),
    ({"data": {"alpha": 0.0}}, "'data.alpha': must be > 0"),
    ({"data": {"alpha": -1}}, "'data.alpha': must be > 0"),
    ({"rounds": 0}, "'rounds': must be >= 1"),
    ({"rounds": 2.5}, "'rounds': expected an integer"),
    ({"privacy": {"epsilon": 8, "noise_multiplier": 1.0}}, "not both"),
    ({"privacy": {"clipping": "sometimes"}}, "unknown value 'sometimes'"),
    ({"data": {"partition": "zipf"}}, "'data.partition'"),
    ({"cra": {"rho": 0.5}}, "'cra.rho'"),
    ({"model": "resnet50"}, "'model': unknown value 'resnet50'; choose one of cnn, resnet18_gn, wrn16_4"),
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


def test_default_model_keeps_run_ids_of_configs_without_the_key():
    import dataclasses, hashlib, json
    from raysim.config import RuntimeConfig, result_hash

    cfg = config_from_dict({"rounds": 3})
    data = dataclasses.replace(cfg.data, root=None, cache_dir=None, download=False)
    values = dataclasses.asdict(cfg.replace(runtime=RuntimeConfig(), data=data))
    assert values.pop("model") == "cnn"
    for newer in ("eval_every", "clients_per_round", "participation", "replicate"):   # defaults left out the same way
        values.pop(newer)
    values["runtime"].pop("eval_on")
    values["runtime"].pop("malloc_tuning")
    values["adpc"].pop("read"), values["adpc"].pop("step")
    values["data"].pop("train_subsample")   # the values that reproduce the earlier behaviour
    before = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert result_hash(cfg) == before
    assert result_hash(config_from_dict({"rounds": 3, "model": "wrn16_4"})) != before
