"""The client actor: one process that trains whichever clients its tasks name.

This module is what a client actor's process imports, and it imports only ``ray``: torch and the
training side (:class:`raysim.client.ClientRunner`) load when the actor first needs them, at
:meth:`ClientActor.warm` or its first task. ``import torch`` costs about 1.6 s of CPU per process
here, so an actor that a run keeps in reserve (more actors than the CPUs it holds, see
:meth:`raysim.runtime.ray_executor.RayExecutor.active_actors`) starts in a fraction of that. The
server side (pandas, pyarrow, the accountants, the CLI) never loads in it;
``tests/integration/test_actor_startup.py`` checks ``sys.modules`` inside live actors.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from raysim.client import ClientRunner
    from raysim.config import Config
    from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload

__all__ = ["ClientActor"]


@ray.remote
class ClientActor:
    """Hosts one :class:`~raysim.client.ClientRunner`; trains whichever client a task names.

    Every task carries its run's setup ``(token, cfg, clipping, [train arrays ref])`` (one object
    per run): the actor (re)configures its runner whenever the token changes, so a warm actor lent
    to the next run of a sweep, or an actor Ray restarted mid-run, always trains with the run's
    own configuration and data.
    """

    def __init__(self, gpu_memory_fraction: float | None = None) -> None:
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

    def warm(self, setup: tuple[str, Config, str, list]) -> bool:
        """Import the training side and configure for the run now (an active actor, at start-up)."""
        self._runner(setup)
        return True

    def _runner(self, setup: tuple[str, Config, str, list]) -> ClientRunner:
        from raysim.client import ClientRunner
        token, cfg, clipping, train_ref = setup
        if self.runner is None or train_ref[0] != self.train_ref:
            # The train arrays travel as a reference inside each run's setup, not as a constructor
            # argument: an actor that Ray restarts fetches them again at its next task.
            self.train_ref = train_ref[0]
            self.runner = ClientRunner(cfg, clipping, ray.get(train_ref[0]))
            self.token = token
            self.trained = set()
        elif token != self.token:
            self.runner.configure(cfg, clipping)
            self.token = token
            self.trained = set()
        return self.runner

    def train(self, payload: RoundPayload, task: ClientTask, client: ClientData,
              setup: tuple[str, Config, str, list]) -> ClientResult:
        runner = self._runner(setup)
        self.trained.add(task.client_id)
        return runner.train(payload, task, client)

    def train_many(self, payload: RoundPayload, tasks: list[ClientTask], clients: list[ClientData],
                   setup: tuple[str, Config, str, list]) -> list[ClientResult]:
        """Several clients of one round, one after another (one Ray task for an actor's share)."""
        return [self.train(payload, t, c, setup) for t, c in zip(tasks, clients)]

    def evaluate(self, weights: Any, test: tuple, setup: tuple[str, Config, str, list]) -> tuple[list[float], Any]:
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
