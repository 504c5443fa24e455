"""A run planned once: :func:`plan_run` settles a config into a frozen :class:`RunPlan` before anything
starts, and every later step of the run reads the plan: ``raysim run``, ``sweep``, ``tune`` and ``audit``,
the progress bar, the driver and the client actors.

Planning applies the method's preset switches (``feddimdp-no-adpc`` sets ``feddimdp.adpc=false``), checks
the config against the registries and the privacy plan (no data is read), and fixes what the run's rows and
actors need: the clipping mode, the run id, the server hold-out size, the uploads ε does not cover, whose ε
it is, and the part of the config a sweep's actor pool reads. This module is the only caller of
:func:`raysim.algorithms.registry.resolve_preset`.

Importing it imports neither torch nor Ray.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raysim.config import (MODEL_NAMES, SEQUENCE_MODELS, Config, ConfigError, DataConfig, RuntimeConfig, result_hash,
                           server_holdout_size)

if TYPE_CHECKING:
    from raysim.algorithms.base import MethodSpec

__all__ = ["ActorNeeds", "RunPlan", "plan_run", "run_id_for"]


@dataclass(frozen=True)
class ActorNeeds:
    """The part of a run's config that starting its client actors reads (its number of clients, its data
    and runtime sections): what a run sends a sweep's actor pool. A whole ``Config`` carries every
    registered method's section, and unpickling it imports those methods' modules, torch with them."""

    num_clients: int
    data: DataConfig
    runtime: RuntimeConfig

    @classmethod
    def of(cls, cfg: Config) -> "ActorNeeds":
        return cls(cfg.num_clients, cfg.data, cfg.runtime)


@dataclass(frozen=True)
class RunPlan:
    """What a run is, settled before anything starts. ``cfg`` has the method's presets applied (what the
    runs table stores); ``spec`` is the method; ``clipping`` the resolved ``privacy.clipping``;
    ``server_holdout`` the training examples held out for the server; ``epsilon_exceptions`` the opt-in keys
    of the uploads ε does not cover ("" when it covers every one); ``epsilon_scope`` whose ε it is
    (per-client, population or deployment); ``needs`` (derived from the config) what the client actors are started from.

    Pickled (to a driver or client actor), a plan carries its method by name and finds its spec in the
    receiving process's registry, where the same plugins are loaded."""

    cfg: Config
    clipping: str
    run_id: str
    server_holdout: int
    epsilon_exceptions: str
    epsilon_scope: str
    spec: "MethodSpec" = field(compare=False, repr=False)

    @property
    def needs(self) -> ActorNeeds:
        return ActorNeeds.of(self.cfg)

    def __reduce__(self):
        values = tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "spec")
        return _unpickle_plan, values

    def with_runtime(self, runtime: RuntimeConfig) -> "RunPlan":
        """The same run executed with other runtime settings (where and how fast: never its results, so
        its id stays)."""
        return dataclasses.replace(self, cfg=self.cfg.replace(runtime=runtime))


def _unpickle_plan(*values: object) -> RunPlan:
    from raysim.algorithms.registry import get_method
    cfg = values[0]
    return RunPlan(*values, spec=get_method(cfg.method))   # type: ignore[arg-type, misc]


def _settle(cfg: Config) -> tuple[Config, "MethodSpec"]:
    """``cfg`` with its method's presets applied, and its method."""
    from raysim.algorithms.registry import get_method, resolve_preset
    cfg = resolve_preset(cfg)
    return cfg, get_method(cfg.method)


def _run_id(cfg: Config, spec: "MethodSpec") -> str:
    """``<method>-<data>-s<seed>-<hash>`` of a settled config; the hash keeps only the method sections the
    run uses (its method owns them and has them switched on)."""
    used = [name for name, _ in cfg.sections if name in spec.params and spec.uses_section(cfg, name)]
    return f"{cfg.method}-{cfg.data.name}-s{cfg.seed}-{result_hash(cfg, used)[:10]}"


def run_id_for(cfg: Config | RunPlan) -> str:
    """A run's stable id: a readable prefix and the hash of every config key that changes its results. A
    config naming a preset (``feddimdp-no-adpc``) and the same config with the preset's switches written out
    have one id."""
    if isinstance(cfg, RunPlan):
        return cfg.run_id
    return _run_id(*_settle(cfg))


def _check_registries(cfg: Config, spec: "MethodSpec") -> None:
    """The checks of a settled config that need the registries (data set, model, engine, method)."""
    from raysim.data import DATASETS
    if cfg.data.name not in DATASETS:
        raise ConfigError(f"config key 'data.name': unknown dataset {cfg.data.name!r}; choose one of {', '.join(sorted(DATASETS))}")
    tokens = DATASETS[cfg.data.name].kind == "tokens"
    if cfg.model in MODEL_NAMES and tokens != (cfg.model in SEQUENCE_MODELS):
        fits = [m for m in MODEL_NAMES if (m in SEQUENCE_MODELS) == tokens]
        raise ConfigError(f"config key 'model': {cfg.model!r} reads {'images' if tokens else 'token sequences'}, and "
                          f"data set {cfg.data.name!r} has {'token sequences' if tokens else 'images'}; "
                          f"choose {' or '.join(fits)}")
    from raysim.privacy.grad_sample import ENGINES   # the engine registry owns the names
    if cfg.privacy.engine not in ENGINES:
        raise ConfigError(f"config key 'privacy.engine': unknown value {cfg.privacy.engine!r}; "
                          f"choose one of {', '.join(sorted(ENGINES))}")
    if cfg.runtime.sum_on_actors and not spec.sums_updates:
        from raysim.algorithms.registry import all_methods
        able = ", ".join(sorted(s.name for s in all_methods() if s.sums_updates))
        raise ConfigError(f"config key 'runtime.sum_on_actors': method {cfg.method!r}'s server reads each client's "
                          f"update, so its actors cannot sum them; methods that can: {able}")


def plan_run(cfg: Config | RunPlan) -> RunPlan:
    """Settle ``cfg`` into its :class:`RunPlan` (a plan is returned as it is): presets applied, then checked
    against the registries and the privacy plan. Raises :class:`ConfigError` for what the run would refuse."""
    if isinstance(cfg, RunPlan):
        return cfg
    from raysim.privacy.plan import epsilon_exceptions, resolve_clipping
    from raysim.privacy.population import epsilon_scope
    cfg, spec = _settle(cfg)
    _check_registries(cfg, spec)
    clipping = resolve_clipping(spec, cfg)
    return RunPlan(cfg, clipping, _run_id(cfg, spec), server_holdout_size(cfg), epsilon_exceptions(spec, cfg, clipping),
                   epsilon_scope(cfg), spec)
