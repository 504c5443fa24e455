"""Sweep files: one base config times a grid of dotted keys, expanded into validated run configs.

A sweep file has four keys::

    name: smoke                      # optional; default: the file's stem
    base: {...} | path/to/config.yaml  # a config mapping, or a config file relative to this file
    grid:                            # dotted config key -> list of values; the cartesian product
      method: [fedavg, fedsa]
      data.alpha: [0.3, 0.1]
    overrides:                       # optional; applied in order to every grid point they match
      - when: {method: fedsa}        # dotted key -> value, or a list of accepted values
        set: {privacy.epsilon: 8}

Precedence, lowest first: ``base``, ``--set`` (which may not name a grid key), the grid point,
the matching ``overrides``. A mapping given as a value (in ``grid`` or ``set``) is merged key by
key, never replacing a whole section. Grid points that resolve to the same run (same
``run_id``: e.g. an override pins a key the grid varies) are run once. Nothing here imports Ray.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from raysim.config import (DEFAULT_MECHANISM, Config, ConfigError, apply_overrides, cli_overrides, config_from_dict, config_to_dict,
                           dotted_get, read_yaml)

if TYPE_CHECKING:
    from raysim.run_plan import RunPlan

__all__ = ["Sweep", "load_sweep", "expand_sweep", "check_sweep", "read_statuses", "sweep_id_for", "run_label"]

_SWEEP_KEYS = ("name", "base", "grid", "overrides")


@dataclass(frozen=True)
class Sweep:
    name: str
    sweep_id: str
    configs: tuple[Config, ...]
    run_ids: tuple[str, ...]   # the configs' run ids, in the same order
    duplicates: int = 0   # grid points that resolved to a run already listed


def run_label(cfg: Config) -> str:
    """Short human label of a run: what the grid usually varies."""
    alpha = f" α={cfg.data.alpha:g}" if cfg.data.partition == "dirichlet" else f" {cfg.data.partition}"
    cohort = (f" {cfg.clients_per_round}/{cfg.num_clients} {cfg.participation}"
              if cfg.clients_per_round is not None else "")
    model = f" {cfg.model}" if cfg.model != "cnn" else ""
    p = cfg.privacy
    privacy = ("" if p.epsilon is None else f" ε={p.epsilon:g}") + (" client" if p.unit == "client" else "") + \
        (f" {p.mechanism}" if p.mechanism != DEFAULT_MECHANISM else "")
    return f"{cfg.method} {cfg.data.name}{alpha}{cohort}{model}{privacy} seed={cfg.seed}"


def sweep_id_for(name: str, run_ids: Sequence[str]) -> str:
    """``<name>-<hash>``: the hash covers the set of run identities, so runtime settings, data paths
    and the order of grid keys do not change it (a resumed sweep keeps its id)."""
    digest = hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"sweep key {prefix}{key!r}: expected a non-empty string")
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(values: Mapping[str, Any], key: str) -> Any:
    """The value of a dotted key in raw config values, falling back to the Config default."""
    found = dotted_get(values, key, _UNSET)
    if found is not _UNSET:
        return found
    try:                                    # method sections included, at their defaults
        return dotted_get(config_to_dict(Config()), key)
    except KeyError:
        raise ConfigError(f"sweep overrides: unknown config key '{key}' in `when`") from None


_UNSET = object()


@dataclass(frozen=True)
class _Rule:
    index: int
    when: tuple[tuple[str, tuple[Any, ...]], ...]
    set: tuple[tuple[str, Any], ...]

    def matches(self, values: Mapping[str, Any]) -> bool:
        return all(_lookup(values, key) in accepted for key, accepted in self.when)


def _parse_rules(raw: Any) -> list[_Rule]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError("sweep key 'overrides': expected a list of {when: ..., set: ...} entries")
    rules = []
    for i, entry in enumerate(raw, 1):
        if not isinstance(entry, Mapping) or set(entry) != {"when", "set"}:
            raise ConfigError(f"sweep overrides entry {i}: expected exactly the keys `when` and `set`, got {entry!r}")
        if not isinstance(entry["when"], Mapping) or not entry["when"] or not isinstance(entry["set"], Mapping):
            raise ConfigError(f"sweep overrides entry {i}: `when` and `set` must be mappings (`when` non-empty)")
        when = tuple((k, tuple(v) if isinstance(v, list) else (v,)) for k, v in _flatten(entry["when"]))
        rules.append(_Rule(i, when, tuple(_flatten(entry["set"]))))
    return rules


def _parse_grid(raw: Any) -> list[tuple[str, list[Any]]]:
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("sweep key 'grid': expected a non-empty mapping of dotted config keys to lists of values")
    grid = []
    for key, values in raw.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"sweep grid key {key!r}: expected a dotted config key")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep grid key '{key}': expected a non-empty list of values, got {values!r}")
        grid.append((key, values))
    return grid


def file_base(spec: Any, kind: str, keys: Sequence[str], base_dir: Path) -> dict[str, Any]:
    """The checked top level of a ``kind`` file (sweep, tune) with only ``keys``, and its ``base``: a
    config mapping, or a config file relative to ``base_dir``."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{kind} file: expected a mapping at the top level")
    unknown = sorted(set(spec) - set(keys))
    if unknown:
        raise ConfigError(f"{kind} key '{unknown[0]}': unknown key; valid keys: {', '.join(keys)}")
    base = spec.get("base", {})
    if isinstance(base, str):
        return read_yaml(base_dir / base)
    if base is None:
        return {}
    if not isinstance(base, Mapping):
        raise ConfigError(f"{kind} key 'base': expected a config mapping or a path to a config file")
    return dict(base)


def expand_sweep(spec: Mapping[str, Any], *, name: str, base_dir: Path = Path("."),
                 overrides: Sequence[tuple[str, Any]] = ()) -> Sweep:
    """Expand a parsed sweep file into validated, de-duplicated configs (grid order, last key fastest)."""
    from raysim.run_plan import run_id_for
    base = file_base(spec, "sweep", _SWEEP_KEYS, base_dir)
    name = str(spec.get("name") or name)
    if isinstance(base.get("method"), list):
        raise ConfigError("sweep key 'base.method': give one method here and list several under grid.method")
    grid = _parse_grid(spec.get("grid"))
    rules = _parse_rules(spec.get("overrides"))
    grid_keys = {k for k, _ in grid}
    for key, _ in overrides:
        if key in grid_keys:
            raise ConfigError(f"--set {key}: this key is a grid key of the sweep; edit the grid instead")
    base_values = apply_overrides(dict(base), list(overrides))

    configs: list[Config] = []
    seen: dict[str, None] = {}   # run ids in grid order
    used_rules: set[int] = set()
    duplicates = 0
    for point in itertools.product(*(values for _, values in grid)):
        pairs = [pair for (key, _), value in zip(grid, point)
                 for pair in (_flatten({key: value}) if isinstance(value, Mapping) else [(key, value)])]
        values = apply_overrides(base_values, pairs)
        for rule in rules:
            if rule.matches(values):
                used_rules.add(rule.index)
                values = apply_overrides(values, list(rule.set))
        where = ", ".join(f"{k}={v}" for (k, _), v in zip(grid, point))
        try:
            cfg = config_from_dict(values)
        except ConfigError as exc:
            raise ConfigError(f"sweep grid point ({where}): {exc}") from None
        run_id = run_id_for(cfg)
        if run_id in seen:
            duplicates += 1
            continue
        seen[run_id] = None
        configs.append(cfg)
    for rule in rules:
        if rule.index not in used_rules:
            raise ConfigError(f"sweep overrides entry {rule.index}: `when` {dict(rule.when)} matches no grid point")
    return Sweep(name, sweep_id_for(name, list(seen)), tuple(configs), tuple(seen), duplicates)


def load_sweep(path: str | Path, overrides: Sequence[str] = (), data_root: str | None = None,
               address: str | None = None) -> Sweep:
    """Read and expand a sweep file; ``--set``, ``--data-root`` and ``--address`` apply to its base."""
    p = Path(path)
    return expand_sweep(read_yaml(p), name=p.stem, base_dir=p.parent,
                        overrides=cli_overrides(tuple(overrides), data_root, address))


def check_sweep(sweep: Sweep) -> list[RunPlan]:
    """Plan every run of the sweep as ``raysim run`` plans it (:func:`raysim.run_plan.plan_run`: presets
    applied, then the registry and privacy-plan checks) before anything starts; cheap, no data is read.
    Returns the plans, in the sweep's order."""
    from raysim.run_plan import plan_run
    plans = []
    for cfg in sweep.configs:
        try:
            plans.append(plan_run(cfg))
        except ValueError as exc:
            raise ConfigError(f"sweep run ({run_label(cfg)}): {exc}") from None
    return plans


def read_statuses(sweep: Sweep, results_dir: str) -> dict[str, dict[str, Any] | None]:
    """The runs row of every run of the sweep already in ``results_dir`` (None where there is none)."""
    from raysim.results import ResultsSink
    sink = ResultsSink(results_dir)
    return {run_id: sink.read_run(run_id) for run_id in sweep.run_ids}
