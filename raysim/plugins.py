"""Methods, data sets and models from outside raysim: entry points and the config's ``plugins`` key.

A package registers its additions when its module is imported (``raysim.algorithms.registry.register``,
``raysim.data.register_dataset``, ``raysim.models.register_model``). raysim imports such modules from two
sources, before it resolves any name:

* **Entry points** of an installed distribution, in the groups ``raysim.methods``, ``raysim.datasets``
  and ``raysim.models`` (each entry point names a module, or an object in it; loading it imports it).
* **The config key** ``plugins: [my_pkg.my_method, ...]``: module names, imported when the config is parsed.

Every process that runs raysim code does the same: the driver when it parses its config, and each Ray
worker (client and driver actors, the sweep's run tasks) through Ray's own ``worker_process_setup_hook``,
which :func:`runtime_env` hands to ``ray.init``; the config's modules travel in that runtime environment's
``RAYSIM_PLUGINS`` variable. This module imports nothing of raysim, torch or ray.
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata
from typing import Any, Iterable

__all__ = ["GROUPS", "ENV_VAR", "PluginError", "load", "import_plugins", "origin_of", "imported", "runtime_env",
           "setup_worker"]

GROUPS = ("raysim.methods", "raysim.datasets", "raysim.models")
#: Comma-separated module names a Ray worker imports at start (set by :func:`runtime_env`).
ENV_VAR = "RAYSIM_PLUGINS"

_entry_points_loaded = False
#: module name -> where it came from ("entry point raysim.methods: NAME (DIST VERSION)" or "config key 'plugins'")
_ORIGINS: dict[str, str] = {}
_CONFIG_MODULES: list[str] = []


class PluginError(ValueError):
    """A plugin named by the config or an entry point cannot be imported (a user error: one line)."""


def _import(module: str, origin: str) -> None:
    if module in _ORIGINS:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise PluginError(f"{origin}: cannot import {module!r}: {exc}") from None
    _ORIGINS[module] = origin


def load_entry_points() -> None:
    """Import every module that an installed distribution declares in :data:`GROUPS` (once per process)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for group in GROUPS:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = f" ({ep.dist.name} {ep.dist.version})" if getattr(ep, "dist", None) else ""
            origin = f"entry point {group}: {ep.name}{dist}"
            module = ep.value.split(":", 1)[0].strip()
            if module in _ORIGINS:
                continue
            try:
                ep.load()
            except ImportError as exc:
                raise PluginError(f"{origin}: cannot import {ep.value!r}: {exc}") from None
            _ORIGINS[module] = origin


def import_plugins(modules: Iterable[str]) -> None:
    """Import the config's ``plugins`` modules (and remember them for :func:`runtime_env`)."""
    for module in modules:
        if not isinstance(module, str) or not module:
            raise PluginError(f"config key 'plugins': expected module names, got {module!r}")
        _import(module, "config key 'plugins'")
        if module not in _CONFIG_MODULES:
            _CONFIG_MODULES.append(module)


def load(modules: Iterable[str] = ()) -> None:
    """Entry points, then ``modules``, then those a Ray worker was started with (:data:`ENV_VAR`)."""
    load_entry_points()
    import_plugins(modules)
    env = os.environ.get(ENV_VAR, "")
    import_plugins([m for m in env.split(",") if m])


def origin_of(module: str) -> str | None:
    """Where a plugin module came from, or None for a module raysim did not import as a plugin."""
    return _ORIGINS.get(module)


def imported() -> tuple[str, ...]:
    """The config-named plugin modules this process imported (what its Ray workers import too)."""
    return tuple(_CONFIG_MODULES)


def runtime_env() -> dict[str, Any]:
    """The runtime environment for ``ray.init``: where this process has plugins (an entry point installed,
    or modules from the config or :data:`ENV_VAR`), every worker runs :func:`setup_worker` when it starts.
    Without plugins it is empty: Ray cannot hand a worker with a setup hook one of the idle worker
    processes it starts ahead, so the hook costs each actor about 2 s of start-up for nothing."""
    load_entry_points()
    modules = list(imported()) + [m for m in os.environ.get(ENV_VAR, "").split(",") if m and m not in imported()]
    if not modules and not _ORIGINS:
        return {}
    env: dict[str, Any] = {"worker_process_setup_hook": "raysim.plugins.setup_worker"}
    if modules:
        env["env_vars"] = {ENV_VAR: ",".join(modules)}
    return env


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: import the entry points and the run's plugin modules."""
    load()
