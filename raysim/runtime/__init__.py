"""Where clients run: the driver hosts that ``raysim.experiment.run_experiment`` is given.

This package is the only one in raysim that imports ray, and it does so only when a Ray driver host
is chosen. It sits above ``experiment``: it imports it, never the other way round. Nothing is
imported at package level: a client actor imports ``raysim.runtime.ray_executor``, and must not
pull in the server side (``experiment``, the results tables, the accountants) on the way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysim.config import Config

if TYPE_CHECKING:
    from raysim.experiment import DriverHost, RunSummary
    from raysim.run_plan import RunPlan

__all__ = ["driver_host_for", "execute", "execute_row", "head_starts"]


def driver_host_for(cfg: Config, placement_group: Any = None, pool: Any = None,
                    head_start: Any = None) -> "DriverHost":
    """The driver host ``runtime.executor`` names: serial (in process), or Ray: a driver actor
    (``runtime.address``), or this process with a head start (:func:`head_starts`, or ``head_start``:
    the :class:`~raysim.runtime.sweep_runner.SweepRay` of a sweep's first run); ``pool`` is a sweep's
    warm-actor pool (Ray only)."""
    if cfg.runtime.executor == "serial":
        from raysim.runtime.serial import InProcessDriverHost
        return InProcessDriverHost()
    if head_start is not None or head_starts(cfg, placement_group, pool):
        from raysim.runtime.head_start import HeadStartHost
        return HeadStartHost(head_start)
    from raysim.runtime.driver import RayDriverHost
    return RayDriverHost(cfg.runtime.address, placement_group, pool)


def head_starts(cfg: Config, placement_group: Any = None, pool: Any = None) -> bool:
    """Whether a Ray run trains its first clients in this process while it starts a local Ray
    (``runtime.head_start``, :mod:`raysim.runtime.head_start`): only where this process would start
    that Ray itself (no address, no Ray running here, not a sweep's run task: a sweep's own first run
    asks :func:`raysim.runtime.sweep_runner.first_run_head_starts`), clients train on CPUs and each client
    returns its own update (not ``runtime.sum_on_actors``, whose sums would then depend on when the
    actors took over)."""
    import os
    import ray
    r = cfg.runtime
    return (r.head_start and not r.sum_on_actors and r.num_gpus_per_client == 0 and placement_group is None
            and pool is None
            and not r.address and not os.environ.get("RAY_ADDRESS") and not ray.is_initialized())


def execute(plan: "RunPlan | Config", results_dir: str, *, placement_group: Any = None, pool: Any = None,
            head_start: Any = None, **kwargs: Any) -> "RunSummary":
    """Run ``plan`` (a config is planned first) on the driver host it names (:func:`driver_host_for`);
    ``kwargs`` go to ``run_experiment``."""
    from raysim.experiment import run_experiment
    from raysim.run_plan import plan_run
    plan = plan_run(plan)
    return run_experiment(plan, results_dir, driver_host_for(plan.cfg, placement_group, pool, head_start), **kwargs)


def execute_row(plan: "RunPlan | Config", results_dir: str, *, sweep_id: str | None = None, placement_group: Any = None,
                pool: Any = None, head_start: Any = None, restart: bool = False) -> dict[str, Any]:
    """:func:`execute` returning the final runs row: the ``run_one`` a sweep is given."""
    return execute(plan, results_dir, sweep_id=sweep_id, placement_group=placement_group, pool=pool,
                   head_start=head_start, restart=restart).row
