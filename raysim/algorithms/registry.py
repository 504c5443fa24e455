"""Name → method registry (refuses duplicates, like Opacus' accountant registry).

Registering a :class:`~raysim.algorithms.base.MethodSpec` registers its config sections (``params``)
with the config parser; the results schema reads the columns each registered method declares.
The built-in methods are found by discovery: every module of the ``raysim.algorithms`` package is
imported once, the first time the registry is asked, and each registers itself; then the plugins
(:mod:`raysim.plugins`: entry points, the config's ``plugins`` modules) are imported. A method defined
anywhere else registers itself when its module is imported.

This module imports neither torch nor the method modules at import time; ``raysim/__init__.py``
installs :func:`load_methods` as the config parser's section loader.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import TYPE_CHECKING

from raysim.config import (Config, ConfigError, add_section_loader, config_from_dict, config_to_dict, dotted_get,
                           dotted_set, register_section, unregister_section)

if TYPE_CHECKING:
    from raysim.algorithms.base import MethodSpec

_METHODS: dict[str, "MethodSpec"] = {}
_REGISTERED_BY: dict[str, str] = {}   # method name -> the module whose import registered it
_LOADED = False


def register(spec: "MethodSpec") -> "MethodSpec":
    """Register ``spec`` and its config sections; returns it."""
    if spec.name in _METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    for name, cls in spec.params.items():
        register_section(name, cls)
    _METHODS[spec.name] = spec
    _REGISTERED_BY[spec.name] = sys._getframe(1).f_globals.get("__name__", "")
    return spec


def origin(spec: "MethodSpec") -> str:
    """Where a registered method comes from: built in, a plugin (entry point or the config's ``plugins``),
    or another module that registered it when it was imported."""
    from raysim import plugins
    module = _REGISTERED_BY.get(spec.name) or getattr(spec.server, "__module__", "") or ""
    if module.startswith("raysim."):
        return f"built in ({module})"
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = plugins.origin_of(".".join(parts[:i]))
        if found:
            return f"{found}, module {module}"
    return f"module {module}"


def unregister(name: str) -> None:
    """Remove a method, and its sections when no other registered method declares them (tests)."""
    spec = _METHODS.pop(name, None)
    _REGISTERED_BY.pop(name, None)
    if spec is None:
        return
    still = {s for other in _METHODS.values() for s in other.params}
    for section in spec.params:
        if section not in still:
            unregister_section(section)


def get_method(name: str) -> "MethodSpec":
    load_methods()
    if name not in _METHODS:
        raise ConfigError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def all_methods() -> list["MethodSpec"]:
    load_methods()
    return [_METHODS[n] for n in sorted(_METHODS)]


def resolve_preset(cfg: Config) -> Config:
    """Apply the preset switches of ``cfg.method`` (e.g. ``feddimdp-no-adpc`` sets ``feddimdp.adpc=false``).

    Preset keys default to null (unset); a value the user set that contradicts the preset is a config
    error. The resolved config (what the runs table stores) shows the switches used. Idempotent. A run
    applies them once, when it is planned (:func:`raysim.run_plan.plan_run`).
    """
    spec = get_method(cfg.method)
    if not spec.preset:
        return spec.resolve(cfg)
    values = config_to_dict(cfg)
    for key, wanted in spec.preset.items():
        given = dotted_get(values, key)
        if given is not None and given != wanted:
            raise ConfigError(f"config key '{key}': method {cfg.method!r} is the preset {key}={wanted}; "
                              f"use method {spec.preset_of!r} to choose the switches yourself")
        dotted_set(values, key, wanted)
    return spec.resolve(config_from_dict(values))


def load_methods() -> None:
    """Import every module of the ``raysim.algorithms`` package once (each method module registers
    itself); lazily, so that importing the registry or the config stays cheap."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    package = importlib.import_module("raysim.algorithms")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        importlib.import_module(f"raysim.algorithms.{info.name}")
    from raysim import plugins
    plugins.load()


add_section_loader(load_methods)
