"""The driver (server) actor: holds the global model and the strategy, streams round records.

The process that submitted the run consumes the stream and writes the Parquet rows, so all
rows land where that process runs (the head node under ``ray job submit``).
"""

from __future__ import annotations

from typing import Any, Iterator

import ray

from raysim.config import Config
from raysim.runtime.ray_executor import RayExecutor
from raysim.simulation import RoundRecord, SetupRecord, Simulation


@ray.remote(num_cpus=0)
class DriverActor:
    def __init__(self, cfg: Config, train_ref: list, test_ref: list, placement_group: Any = None,
                 resume: bytes | None = None) -> None:
        self.executor = RayExecutor(placement_group)
        self.sim = Simulation(cfg, ray.get(train_ref[0]), ray.get(test_ref[0]), self.executor, train_handle=train_ref)
        if resume is not None:
            self.sim.restore(resume)

    def setup(self) -> SetupRecord:
        return self.sim.setup

    @ray.method(num_returns="streaming")
    def rounds(self) -> Iterator[RoundRecord]:
        yield from self.sim.run()

    def placements(self) -> list[dict[str, Any]]:
        return self.executor.placements()

    def client_actors(self) -> list[Any]:
        return list(self.executor.actors)

    def shutdown(self) -> None:
        self.executor.shutdown()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join ``address`` (or $RAY_ADDRESS, e.g. inside a Ray job), else start a local Ray."""
    if ray.is_initialized():
        return
    import os
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": True, "logging_level": "ERROR"}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)


def ray_rounds(cfg: Config, train: Any, test: Any, placement_group: Any = None,
               resume: bytes | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], Any]:
    """Start a driver actor for one run; returns its setup, the round stream, and the actor."""
    options: dict[str, Any] = {}
    if placement_group is not None:
        # The driver holds no resources (num_cpus=0) but belongs with its run's clients.
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement_group)
    driver = DriverActor.options(**options).remote(cfg, [ray.put(train)], [ray.put(test)], placement_group, resume)
    setup = ray.get(driver.setup.remote())

    def stream() -> Iterator[RoundRecord]:
        try:
            for ref in driver.rounds.remote():
                yield ray.get(ref)
        finally:
            try:
                ray.get(driver.shutdown.remote())
            except Exception:  # the actor may already be gone after a failure
                pass
            ray.kill(driver)

    return setup, stream(), driver


def run_placement(driver: Any) -> dict[str, str]:
    """Where a run executes: node ids of its client actors (JSON list, actor order) and of the
    process that writes its rows. Call before iterating the rounds (the actor serves one call at a time)."""
    import json
    nodes = [p["node_id"] for p in ray.get(driver.placements.remote())]
    return {"client_nodes": json.dumps(nodes), "writer_node": ray.get_runtime_context().get_node_id()}


class RayBackend:
    """Runs the simulation in a driver actor on Ray (joining ``address`` or starting a local Ray);
    ``placement_group`` co-locates the run's actors (sweeps)."""

    def __init__(self, address: str | None = None, placement_group: Any = None, pool: Any = None) -> None:
        self.address = address
        self.placement_group = placement_group
        self.pool = pool

    def start(self, cfg: Config, train: Any, test: Any, resume: bytes | None = None
              ) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        init_ray(self.address)
        setup, records, driver = ray_rounds(cfg, train, test, self.placement_group, resume)
        return setup, records, run_placement(driver)
