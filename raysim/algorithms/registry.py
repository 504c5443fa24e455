"""Name → method registry (refuses duplicates, like Opacus' accountant registry)."""

from __future__ import annotations

from typing import Any

from raysim.algorithms.base import MethodSpec
from raysim.config import Config, ConfigError, config_from_dict, config_to_dict

_METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.name in _METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    _METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    _load_builtin()
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def all_methods() -> list[MethodSpec]:
    _load_builtin()
    return [_METHODS[n] for n in sorted(_METHODS)]


def _lookup(tree: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree[part]
    return tree, leaf


def resolve_preset(cfg: Config) -> Config:
    """Apply the preset switches of ``cfg.method`` (e.g. ``feddimdp-no-adpc`` sets ``feddimdp.adpc=false``).

    Preset keys default to null (unset); a value the user set that contradicts the preset is a config
    error. The resolved config (what the runs table stores) shows the switches used. Idempotent.
    """
    spec = get_method(cfg.method)
    if not spec.preset:
        return cfg
    values = config_to_dict(cfg)
    for key, wanted in spec.preset.items():
        node, leaf = _lookup(values, key)
        if node[leaf] is not None and node[leaf] != wanted:
            raise ConfigError(f"config key '{key}': method {cfg.method!r} is the preset {key}={wanted}; "
                              f"use method {spec.preset_of!r} to choose the switches yourself")
        node[leaf] = wanted
    return config_from_dict(values)


def _load_builtin() -> None:
    # Importing the method modules registers them; done lazily so importing the registry is cheap.
    from raysim.algorithms import builtin  # noqa: F401
