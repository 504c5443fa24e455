"""Where clients run: the backends that ``raysim.experiment.run_experiment`` is given.

This package is the only one in raysim that imports ray, and it does so only when a Ray backend
is chosen. It sits above ``experiment``: it imports it, never the other way round. Nothing is
imported at package level: a client actor imports ``raysim.runtime.ray_executor``, and must not
pull in the server side (``experiment``, the results tables, the accountants) on the way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysim.config import Config

if TYPE_CHECKING:
    from raysim.experiment import Backend, RunSummary

__all__ = ["backend_for", "execute", "execute_row"]


def backend_for(cfg: Config, placement_group: Any = None, pool: Any = None) -> "Backend":
    """The backend ``runtime.executor`` names: serial (in process) or Ray (``runtime.address``);
    ``pool`` is a sweep's warm-actor pool (Ray only)."""
    if cfg.runtime.executor == "serial":
        from raysim.runtime.serial import SerialBackend
        return SerialBackend()
    from raysim.runtime.driver import RayBackend
    return RayBackend(cfg.runtime.address, placement_group, pool)


def execute(cfg: Config, results_dir: str, *, placement_group: Any = None, pool: Any = None,
            **kwargs: Any) -> "RunSummary":
    """Run ``cfg`` on the backend it names (:func:`backend_for`); ``kwargs`` go to ``run_experiment``."""
    from raysim.experiment import run_experiment
    return run_experiment(cfg, results_dir, backend_for(cfg, placement_group, pool), **kwargs)


def execute_row(cfg: Config, results_dir: str, *, sweep_id: str | None = None, placement_group: Any = None,
                pool: Any = None, restart: bool = False) -> dict[str, Any]:
    """:func:`execute` returning the final runs row: the ``run_one`` a sweep is given."""
    return execute(cfg, results_dir, sweep_id=sweep_id, placement_group=placement_group, pool=pool,
                   restart=restart).row
