"""The driver (server) actor: holds the global model and the strategy, streams round records.

The process that submitted the run consumes the stream and writes the Parquet rows, so all
rows land where that process runs (the head node under ``ray job submit``). That process also
asks for the client actors, before the driver actor exists, so that both start at once; a
sweep's warm pool (:mod:`raysim.runtime.pool`) hands over actors that are already running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import ray

from raysim.allocator import spin_less
from raysim.runtime.client_actor import start_client_actors, warm_actors

if TYPE_CHECKING:
    from raysim.run_plan import RunPlan
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.simulation import RoundRecord, SetupRecord, Simulation


@ray.remote(num_cpus=0)
class DriverActor:
    """Runs one simulation at a time; :meth:`open` starts a run, :meth:`close` ends it (the actor can
    then serve the next run of a sweep)."""

    def __init__(self) -> None:
        spin_less()       # before torch loads in this process
        self.executor: RayExecutor | None = None
        self.sim: Simulation | None = None

    def open(self, plan: RunPlan, train_ref: list, test_ref: list, placement_group: Any = None,
             resume: bytes | None = None, actors: list | None = None, state_dir: str | None = None) -> SetupRecord:
        # Imported here, not with the module: a sweep's pool actor receives this class to create
        # driver actors, and must not load torch and the server side for it.
        from raysim.runtime.ray_executor import RayExecutor
        from raysim.simulation import Simulation
        self.executor = RayExecutor(placement_group, actors or ())
        self.sim = Simulation(plan, ray.get(train_ref[0]), ray.get(test_ref[0]), self.executor, train_handle=train_ref,
                              state_dir=state_dir)
        if resume is not None:
            self.sim.restore(resume)
        return self.sim.setup

    @ray.method(num_returns="streaming")
    def rounds(self) -> Iterator[RoundRecord]:
        assert self.sim is not None, "open() first"
        yield from self.sim.run()

    def placements(self) -> list[dict[str, Any]]:
        return self.executor.placements() if self.executor else []

    def client_actors(self) -> list[Any]:
        return list(self.executor.actors) if self.executor else []

    def ready(self) -> bool:
        return True

    def close(self, keep_actors: bool = False) -> list[Any]:
        """End the run; returns its client actors when ``keep_actors`` (for a warm pool), else kills them."""
        kept: list[Any] = []
        if self.executor is not None:
            if keep_actors:
                kept = self.executor.detach()
            self.executor.shutdown()
        self.executor = self.sim = None
        return kept


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join ``address`` (or $RAY_ADDRESS, e.g. inside a Ray job), else start a local Ray."""
    if ray.is_initialized():
        return
    import os
    from raysim import plugins   # every worker imports the plugins (Ray's worker_process_setup_hook)
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": True, "logging_level": "ERROR",
                              "runtime_env": plugins.runtime_env()}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)


def _pinned_options(placement_group: Any) -> dict[str, Any]:
    if placement_group is None:
        return {}
    # The driver holds no resources (num_cpus=0) but belongs with its run's clients.
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group)}


def ray_rounds(plan: RunPlan, train: Any, test: Any, placement_group: Any = None, resume: bytes | None = None,
               pool: Any = None, state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], Any, bool]:
    """Start (or borrow from ``pool``) a driver actor and client actors for one run; returns its
    setup, the round stream, the driver actor, and whether the actors were warm (from the pool).
    ``state_dir`` (where the driver actor spills client states) must be reachable from the driver
    actor's node: shared storage or a URI on a multi-node cluster, like the results folder."""
    if pool is not None:
        needs = plan.needs
        driver, actors, warm = ray.get(pool.acquire.remote(needs, DriverActor))
        train_ref = ray.get(pool.data.remote(needs, None if ray.get(pool.has_data.remote(needs)) else [ray.put(train)]))
    else:
        warm = False
        # Client actors first, then the driver actor: their processes start while the data is put.
        actors = start_client_actors(plan.needs, placement_group)
        driver = DriverActor.options(**_pinned_options(placement_group)).remote()
        train_ref = [ray.put(train)]
    if not warm:   # the training actors import torch and build the model while the driver actor starts and plans
        warm_actors(plan, actors, train_ref)
    test_ref = [ray.put(test)]
    try:
        setup = ray.get(driver.open.remote(plan, train_ref, test_ref, placement_group, resume, actors, state_dir))
    except BaseException:
        _end(driver, pool, actors, ok=False)
        raise

    return setup, RoundStream(driver, pool, actors), driver, warm


class RoundStream:
    """The round records of a run on Ray. Iterating it to the end returns the actors to the pool (or
    kills them); :meth:`close` ends the run early, also when it was never iterated (its writer failed)."""

    def __init__(self, driver: Any, pool: Any, actors: list) -> None:
        self.driver, self.pool, self.actors = driver, pool, actors
        self.closed = False

    def __iter__(self) -> Iterator[RoundRecord]:
        ok = False
        try:
            for ref in self.driver.rounds.remote():
                yield ray.get(ref)
            ok = True
        finally:
            self._finish(ok)

    def close(self) -> None:
        self._finish(False)

    def _finish(self, ok: bool) -> None:
        if not self.closed:
            self.closed = True
            _end(self.driver, self.pool, self.actors, ok)



def _end(driver: Any, pool: Any, actors: list, ok: bool) -> None:
    """A finished run returns its actors to the pool; a failed one (or one without a pool) kills them."""
    if pool is not None and ok:
        try:
            kept = ray.get(driver.close.remote(keep_actors=True))
            ray.get(pool.release.remote(driver, kept))
            return
        except Exception:  # the pool or an actor is gone: fall through and kill what is left
            pass
    try:
        ray.get(driver.close.remote())
    except Exception:  # the actor may already be gone after a failure
        pass
    for a in [driver, *actors]:
        try:
            ray.kill(a)
        except Exception:
            pass
    if pool is not None:
        try:
            ray.get(pool.discard.remote([driver, *actors]))
        except Exception:
            pass


def run_placement(driver: Any) -> dict[str, str]:
    """:func:`~raysim.runtime.ray_executor.placement_row` of the driver actor's run, whose rows this
    process writes. Call before iterating the rounds (the actor serves one call at a time)."""
    from raysim.runtime.ray_executor import placement_row
    return placement_row(ray.get(driver.placements.remote()))


class RayDriverHost:
    """Runs the simulation in a driver actor on Ray (joining ``address`` or starting a local Ray);
    ``placement_group`` co-locates the run's actors (sweeps), ``pool`` lends warm actors (sweeps)."""

    def __init__(self, address: str | None = None, placement_group: Any = None, pool: Any = None) -> None:
        self.address = address
        self.placement_group = placement_group
        self.pool = pool

    def start(self, plan: RunPlan, train: Any, test: Any, resume: bytes | None = None,
              state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        init_ray(self.address)
        setup, records, driver, warm = ray_rounds(plan, train, test, self.placement_group, resume, self.pool,
                                                  state_dir)
        return setup, records, {**run_placement(driver), "warm_actors": warm}
