"""The client actor: one process that trains whichever clients its tasks name.

This module is what a client actor's process imports, and it imports only ``ray``: torch and the
training side (:class:`raysim.client.ClientRunner`) load when the actor first needs them, at
:meth:`ClientActor.warm` or its first task. ``import torch`` costs about 1.6 s of CPU per process
here, so an actor that a run keeps in reserve (more actors than the CPUs it holds, see
:meth:`raysim.runtime.ray_executor.RayExecutor.active_actors`) starts in a fraction of that. The
server side (pandas, pyarrow, the accountants, the CLI) never loads in it;
``tests/integration/test_actor_startup.py`` checks ``sys.modules`` inside live actors.

It also says how many client actors a run starts and with what resources, and starts and warms
them (:func:`start_client_actors`, :func:`warm_actors`), so that a process which only starts
actors (a sweep's pool, :mod:`raysim.runtime.pool`) loads no torch either.
"""

from __future__ import annotations

import math
import os
import uuid
from typing import TYPE_CHECKING, Any, Sequence

import ray

from raysim.allocator import spin_less
from raysim.run_plan import ActorNeeds, RunPlan

if TYPE_CHECKING:
    from raysim.client import ClientRunner
    from raysim.config import Config
    from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload

#: A run's setup as every task carries it: (token, plan, [train arrays ref]).
Setup = tuple[str, RunPlan, list]

__all__ = ["ActorNeeds", "ClientActor", "actor_count", "cpus_per_actor", "first_active", "start_client_actors",
           "warm_actors"]


@ray.remote
class ClientActor:
    """Hosts one :class:`~raysim.client.ClientRunner`; trains whichever client a task names.

    Every task carries its run's setup ``(token, plan, [train arrays ref])`` (one object per run; the
    plan is the run's :class:`~raysim.run_plan.RunPlan`): the actor (re)configures its runner whenever the token changes, so a warm actor lent
    to the next run of a sweep, or an actor Ray restarted mid-run, always trains with the run's
    own configuration and data.
    """

    def __init__(self, gpu_memory_fraction: float | None = None) -> None:
        spin_less()       # before torch loads in this process
        if gpu_memory_fraction is not None:
            import torch
            if torch.cuda.is_available():
                # Fractional num_gpus only limits scheduling; cap this process's CUDA memory explicitly.
                torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction)
        self.train_ref: Any = None
        self.runner: ClientRunner | None = None
        self.token: str | None = None
        self.trained: set[int] = set()

    def ready(self) -> bool:
        return True

    def warm(self, setup: Setup) -> bool:
        """Import the training side and configure for the run now (an active actor, at start-up)."""
        self._runner(setup)
        return True

    def _runner(self, setup: Setup) -> ClientRunner:
        from raysim.client import ClientRunner
        token, plan, train_ref = setup
        if self.runner is None or train_ref[0] != self.train_ref:
            # The train arrays travel as a reference inside each run's setup, not as a constructor
            # argument: an actor that Ray restarts fetches them again at its next task.
            self.train_ref = train_ref[0]
            self.runner = ClientRunner(plan.cfg, plan.clipping, ray.get(train_ref[0]))
            self.token = token
            self.trained = set()
        elif token != self.token:
            self.runner.configure(plan.cfg, plan.clipping)
            self.token = token
            self.trained = set()
        return self.runner

    def train(self, payload: RoundPayload, task: ClientTask, client: ClientData,
              setup: Setup) -> ClientResult:
        runner = self._runner(setup)
        self.trained.add(task.client_id)
        return runner.train(payload, task, client)

    def train_many(self, payload: RoundPayload, tasks: list[ClientTask], clients: list[ClientData],
                   setup: Setup, sum_updates: bool = False) -> Any:
        """Several clients of one round, one after another (one Ray task for an actor's share). With
        ``sum_updates`` (``runtime.sum_on_actors``): (the results without their Δ, the share's Σ_i w_i Δ_i as
        a float64 array), :func:`raysim.algorithms.base.fold_updates`."""
        results = [self.train(payload, t, c, setup) for t, c in zip(tasks, clients)]
        if not sum_updates:
            return results
        from raysim.algorithms.base import fold_updates
        results, total = fold_updates(self.runner.cfg, results)
        return results, total.numpy()   # an array travels without a copy into pickle's stream

    def train_apart(self, payload: RoundPayload, tasks: list[ClientTask], clients: list[ClientData],
                    setup: Setup) -> list[tuple[ClientResult, Any]]:
        """Several clients of one round, each as (its result with ‖Δ‖ and without Δ, Δ as an array): the
        driver reads Δ in place from the object store and folds it into the round's sum
        (:meth:`raysim.runtime.ray_executor.RayExecutor.collect`)."""
        out = []
        for t, c in zip(tasks, clients):
            r = self.train(payload, t, c, setup)
            out.append((r.without_delta(), r.delta.numpy()))
        return out

    def evaluate(self, weights: Any, test: tuple, setup: Setup) -> tuple[list[float], Any]:
        """Per-batch losses and predictions of the global model on ``test`` = (x, y): this actor's part
        of an evaluation that the executor splits at batch boundaries."""
        return self._runner(setup).eval_batches(weights, *test)

    def modules(self) -> list[str]:
        """Names in this process's ``sys.modules`` (the import-path test)."""
        import sys
        return sorted(sys.modules)

    def where(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "clients": sorted(self.trained)}


def actor_count(cfg: Config | ActorNeeds, resources: dict[str, float] | None = None) -> int:
    """Client actors of a run: ``runtime.num_actors``, else as many as the cluster runs at once
    (its CPUs over ``num_cpus_per_client``, and its GPUs over ``num_gpus_per_client``); never more
    than the clients, never fewer than one."""
    r = cfg.runtime
    if r.num_actors is not None:
        return max(1, min(r.num_actors, cfg.num_clients))
    resources = ray.cluster_resources() if resources is None else resources
    fit = resources.get("CPU", 1.0) / (r.num_cpus_per_client or 1.0)
    if r.num_gpus_per_client > 0:
        fit = min(fit, resources.get("GPU", 0.0) / r.num_gpus_per_client)
    return int(max(1, min(cfg.num_clients, math.floor(fit + 1e-9))))


def cpus_per_actor(cfg: Config | ActorNeeds, num_actors: int) -> float:
    """Configured CPUs per actor, or a share that fits every actor on the cluster at once (≤ 1)."""
    if cfg.runtime.num_cpus_per_client is not None:
        return float(cfg.runtime.num_cpus_per_client)
    total = ray.cluster_resources().get("CPU", 1.0)
    # Rounded *down*: 2 CPUs / 3 actors must not ask for 3 × 0.6667 > 2 (the last actor would never start).
    return max(0.01, math.floor(min(1.0, total / num_actors) * 1e4) / 1e4)


def start_client_actors(cfg: Config | ActorNeeds, placement_group: Any = None, restarts: bool = True) -> list[Any]:
    """Request the run's pool of client actors (:func:`actor_count` of them); returns at once.

    ``restarts=False`` (a sweep's warm pool) creates actors that Ray does not restart: a restarted
    actor needs its resources again, and a pooled one outside any placement group could wait for
    them forever behind idle actors; the sweep instead resumes the run from its checkpoint."""
    num_actors = actor_count(cfg)
    restarts_ = cfg.runtime.max_actor_restarts if restarts else 0
    options: dict[str, Any] = {
        "num_cpus": cpus_per_actor(cfg, num_actors), "num_gpus": cfg.runtime.num_gpus_per_client,
        "max_restarts": restarts_, "max_task_retries": restarts_,
    }
    if placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement_group)
    fraction = cfg.runtime.gpu_memory_fraction if cfg.runtime.num_gpus_per_client > 0 else None
    return [ClientActor.options(**options).remote(fraction) for _ in range(num_actors)]


def first_active(cfg: Config | ActorNeeds, actors: Sequence[Any]) -> list[Any]:
    """The actors that train when all of ``actors`` land on one node (what :meth:`RayExecutor.active_actors`
    finds there): all of them with GPU shares, else as many as the CPUs they hold."""
    if cfg.runtime.num_gpus_per_client > 0:
        return list(actors)
    return list(actors[:max(1, math.floor(len(actors) * cpus_per_actor(cfg, len(actors)) + 0.05))])


def warm_actors(plan: RunPlan, actors: Sequence[Any], train_ref: list) -> list[Any]:
    """Tell the actors that will train (:func:`first_active`) to import torch and build the run's model
    now, while the server starts and plans; returns the refs to wait on. The run's executor re-targets
    them with its own token (a model rebuild; the float rows normalised so far stay)."""
    setup = (f"warm-{uuid.uuid4().hex}", plan, train_ref)
    return [a.warm.remote(setup) for a in first_active(plan.needs, actors)]
