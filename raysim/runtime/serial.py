"""Serial executor: every client in this process, in client-id order (unit tests, debugging)."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from raysim.algorithms.base import fold_updates
from raysim.client import ClientRunner, eval_where
from raysim.run_plan import RunPlan
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload
from raysim.simulation import RoundRecord, SetupRecord, Simulation


class SerialExecutor:
    """Runs the same client code as the Ray actors, without Ray."""

    def __init__(self) -> None:
        self.runner: ClientRunner | None = None
        self.total: Any = None

    def start(self, plan: RunPlan, train: Any) -> None:
        self.runner = ClientRunner(plan.cfg, plan.clipping, train)

    def ready(self) -> None:
        return None

    #: Clients train in this process, when the round is collected.
    overlaps = False

    def submit(self, payload: RoundPayload, tasks: Sequence[ClientTask], clients: Sequence[ClientData],
               fold: Sequence[float] | None = None) -> tuple[RoundPayload, Sequence[ClientTask], Sequence[ClientData]]:
        """Nothing to start: the clients train at :meth:`collect`, which returns their updates (``fold`` is
        not needed: the server sums them in the same order)."""
        return payload, tasks, clients

    def collect(self, handle: tuple[RoundPayload, Sequence[ClientTask], Sequence[ClientData]]) -> list[ClientResult]:
        assert self.runner is not None, "start() first"
        payload, tasks, clients = handle
        results = sorted((self.runner.train(payload, t, c) for t, c in zip(tasks, clients)), key=lambda r: r.client_id)
        if self.runner.cfg.runtime.sum_on_actors:   # one worker: the round's whole cohort in one sum
            results, self.total = fold_updates(self.runner.cfg, results)
        return results

    def take_sum(self) -> Any:
        total, self.total = self.total, None
        return total

    def evaluate(self, weights: Any, x: Any, y: Any, num_classes: int, idle: bool = False) -> Any:
        """The runner evaluates when ``runtime.eval_on`` says actor (on its device); else None: the simulation does."""
        assert self.runner is not None, "start() first"
        return self.runner.evaluate(weights, x, y, num_classes) if eval_where(self.runner.cfg) == "actor" else None

    def shutdown(self) -> None:
        self.runner = None


class InProcessDriverHost:
    """Runs the whole simulation in this process, clients one after another (no Ray)."""

    def start(self, plan: RunPlan, train: Any, test: Any, resume: bytes | None = None,
              state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        sim = Simulation(plan, train, test, SerialExecutor(), state_dir=state_dir)
        if resume is not None:
            sim.restore(resume)
        return sim.setup, sim.run(), {}
