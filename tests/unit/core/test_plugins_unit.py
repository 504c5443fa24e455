"""Plugins in one process: the config's ``plugins`` key, the runtime env Ray workers get, where a method
comes from, and the registries that own the config's choice lists (the cluster test runs a real plugin)."""

from __future__ import annotations

import sys

import pytest

from raysim import plugins
from raysim.algorithms.registry import get_method, origin
from raysim.config import ConfigError, config_from_dict
from raysim.run_plan import plan_run, run_id_for


def test_an_unimportable_plugin_is_a_one_line_error_naming_the_key():
    with pytest.raises(plugins.PluginError, match="config key 'plugins': cannot import 'no_such_plugin_mod'") as info:
        config_from_dict({"plugins": ["no_such_plugin_mod"]})
    assert "\n" not in str(info.value)
    with pytest.raises(plugins.PluginError, match="'plugins': expected module names"):
        config_from_dict({"plugins": [1]})


def test_config_plugins_are_imported_and_travel_to_the_workers(monkeypatch):
    monkeypatch.setattr(plugins, "_CONFIG_MODULES", [])
    monkeypatch.setattr(plugins, "_ORIGINS", {})
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    cfg = config_from_dict({"plugins": ["json"]})
    assert cfg.plugins == ("json",) and "json" in sys.modules
    assert plugins.origin_of("json") == "config key 'plugins'"
    env = plugins.runtime_env()
    assert env == {"worker_process_setup_hook": "raysim.plugins.setup_worker", "env_vars": {plugins.ENV_VAR: "json"}}
    # where the code comes from is not part of a run's identity
    assert run_id_for(cfg) == run_id_for(config_from_dict({}))


def test_without_plugins_the_runtime_env_is_empty(monkeypatch):
    monkeypatch.setattr(plugins, "_CONFIG_MODULES", [])
    monkeypatch.setattr(plugins, "_ORIGINS", {})
    monkeypatch.setattr(plugins, "_entry_points_loaded", True)
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    assert plugins.runtime_env() == {}
    monkeypatch.setattr(plugins, "_ORIGINS", {"my_pkg.methods": "entry point raysim.methods: mine (my-pkg 1.0)"})
    assert plugins.runtime_env() == {"worker_process_setup_hook": "raysim.plugins.setup_worker"}


def test_a_worker_imports_what_its_runtime_env_names(monkeypatch):
    monkeypatch.setattr(plugins, "_CONFIG_MODULES", [])
    monkeypatch.setattr(plugins, "_ORIGINS", {})
    monkeypatch.setenv(plugins.ENV_VAR, "colorsys,json")
    plugins.setup_worker()
    assert {"colorsys", "json"} <= set(plugins.imported())


def test_built_in_methods_say_so():
    assert origin(get_method("fedsa")).startswith("built in (raysim.algorithms.")


def test_registered_models_and_datasets_are_config_choices():
    import numpy as np
    import torch
    from torch import nn

    import raysim.models as models
    from raysim import config

    from raysim.data import DatasetInfo, load_dataset, register_dataset
    from raysim.data import registry as data_registry
    from raysim.models import model_for, register_model
    with pytest.raises(ConfigError, match="'model': unknown value 'unit_mlp'"):
        config_from_dict({"model": "unit_mlp"})
    register_model("unit_mlp", lambda c, s, k, **o: nn.Sequential(nn.Flatten(), nn.Linear(c * s * s, k)))
    info = register_dataset(DatasetInfo("unit_blobs", 3, 1, 4, (0.5,), (0.25,)),
                            lambda split, root: (np.zeros((6, 4, 4, 1), np.uint8), np.arange(6) % 3))
    try:
        cfg = plan_run(config_from_dict({"model": "unit_mlp", "data": {"name": "unit_blobs"}})).cfg
        assert model_for(cfg, info)(torch.zeros(2, 1, 4, 4)).shape == (2, 3)
        assert load_dataset("unit_blobs", "train", None).y.tolist() == [0, 1, 2, 0, 1, 2]
        with pytest.raises(ValueError, match="already registered"):
            register_model("unit_mlp", lambda *a, **k: None)
    finally:
        data_registry.DATASETS.pop("unit_blobs")
        data_registry._LOADERS.pop("unit_blobs")
        models._REGISTERED.pop("unit_mlp")
        config._EXTRA_CHOICES["model"].remove("unit_mlp")


def test_an_unknown_engine_is_a_config_error_before_any_actor_starts():
    with pytest.raises(ConfigError, match="'privacy.engine': unknown value 'bkk'; choose one of .*bk"):
        plan_run(config_from_dict({"method": "fedsa", "privacy": {"engine": "bkk"}}))
