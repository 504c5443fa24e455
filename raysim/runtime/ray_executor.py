"""Ray executor: clients live in actors with fractional CPU/GPU resources.

Each actor hosts the clients ``client_id % num_actors == k`` and receives the train arrays
once, as an object-store reference. Every round the payload (global model and broadcast
state) is ``ray.put`` once and its reference goes to all tasks. Actors restart on failure
(``max_restarts``) and Ray retries their in-flight tasks (``max_task_retries``); because the
client state lives on the server and every random stream is keyed by (round, client), a
retried task returns exactly the same result.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import ray

from raysim.client import ClientRunner
from raysim.config import Config
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload


@ray.remote
class ClientActor:
    def __init__(self, cfg: Config, clipping: str, train_ref: list, clients: Sequence[ClientData]) -> None:
        if cfg.runtime.gpu_memory_fraction is not None and cfg.runtime.num_gpus_per_client > 0:
            import torch
            if torch.cuda.is_available():
                # Fractional num_gpus only limits scheduling; cap this process's CUDA memory explicitly.
                torch.cuda.set_per_process_memory_fraction(cfg.runtime.gpu_memory_fraction)
        self.runner = ClientRunner(cfg, clipping, ray.get(train_ref[0]), clients)

    def train(self, payload: RoundPayload, task: ClientTask) -> ClientResult:
        return self.runner.train(payload, task)

    def where(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "clients": self.runner.client_ids()}


def actor_count(cfg: Config) -> int:
    """Client actors of a run: ``runtime.num_actors`` (default one per client), at most one per client."""
    return min(cfg.runtime.num_actors or cfg.num_clients, cfg.num_clients)


def cpus_per_actor(cfg: Config, num_actors: int) -> float:
    """Configured CPUs per actor, or a share that fits every actor on the cluster at once (≤ 1)."""
    if cfg.runtime.num_cpus_per_client is not None:
        return float(cfg.runtime.num_cpus_per_client)
    total = ray.cluster_resources().get("CPU", 1.0)
    # Rounded *down*: 2 CPUs / 3 actors must not ask for 3 × 0.6667 > 2 (the last actor would never start).
    return max(0.01, math.floor(min(1.0, total / num_actors) * 1e4) / 1e4)


class RayExecutor:
    """Executor over Ray actors; ``placement_group`` (optional) co-locates a run's actors."""

    def __init__(self, placement_group: Any = None) -> None:
        self.actors: list[Any] = []
        self.owner: dict[int, int] = {}
        self.placement_group = placement_group
        self.train_ref: list | None = None

    def start(self, cfg: Config, clipping: str, train: Any, clients: Sequence[ClientData]) -> None:
        num_actors = actor_count(cfg)
        train_ref = train if isinstance(train, list) else [ray.put(train)]
        # Held for the executor's lifetime: a restarted actor re-runs __init__ with these same
        # arguments, and the train arrays must still exist in the object store then.
        self.train_ref = train_ref
        options: dict[str, Any] = {
            "num_cpus": cpus_per_actor(cfg, num_actors), "num_gpus": cfg.runtime.num_gpus_per_client,
            "max_restarts": cfg.runtime.max_actor_restarts, "max_task_retries": cfg.runtime.max_actor_restarts,
        }
        if self.placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.placement_group)
        for k in range(num_actors):
            mine = [c for c in clients if c.client_id % num_actors == k]
            self.actors.append(ClientActor.options(**options).remote(cfg, clipping, train_ref, mine))
            for c in mine:
                self.owner[c.client_id] = k

    def run_round(self, payload: RoundPayload, tasks: Sequence[ClientTask]) -> list[ClientResult]:
        payload_ref = ray.put(payload)
        refs = [self.actors[self.owner[t.client_id]].train.remote(payload_ref, t) for t in tasks]
        results: list[ClientResult] = []
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(done))
        return sorted(results, key=lambda r: r.client_id)

    def placements(self) -> list[dict[str, Any]]:
        return ray.get([a.where.remote() for a in self.actors])

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        self.train_ref = None
