"""Head start: a run's first clients train in the launching process while a fresh local Ray starts.

A ``raysim run`` on a machine without a running Ray starts one, then its client actors, which import
torch and build the model: seconds in which the launching process, which already holds the data, the
model and the plan, would otherwise wait. With ``runtime.head_start`` (the default) and no Ray to
join, the run's server runs in the launching process (as with the serial executor), and
:class:`HeadStartExecutor` trains each round's clients here, one after another, while a second
thread starts Ray and the actors, once the run is planned (Ray's processes starting beside the σ
calibration would slow both on a small machine). Between two clients it checks whether the actors are warm; once
they are, the clients of the round not yet begun go to them, and every later round runs on Ray.
A client's result does not depend on where it trained (the serial executor gives the same bits as
the actors at one ``runtime.torch_threads``), so the tables are those of a run that waited for Ray;
``tests/integration/test_head_start.py`` checks it. The run shuts down the Ray it started when it
ends.

A sweep that starts its own local Ray gives its first run the same head start: the run trains in a
thread of the sweep's process while the sweep's main thread starts Ray, and its actors come from the
sweep's warm-actor pool. Where the head start gets its Ray is its *Ray side* (:class:`RaySide`):
:class:`LocalRay` for a ``raysim run``, :class:`raysim.runtime.sweep_runner.SweepRay` for a sweep.

Runs that join a Ray (``--address``, ``$RAY_ADDRESS``, a Ray job), a sweep's other runs and clients
with GPU shares keep the driver actor (:class:`raysim.runtime.driver.RayDriverHost`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from raysim.client import ClientRunner, eval_where
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload
from raysim.run_plan import RunPlan
from raysim.simulation import RoundRecord, SetupRecord, Simulation

if TYPE_CHECKING:
    from raysim.runtime.ray_executor import RayExecutor


class RaySide(Protocol):
    """Where a head-start run gets its Ray actors: :meth:`start` runs on the executor's second thread."""

    #: whether that thread must stay alive until :meth:`end` (it started Ray's processes)
    parks: bool

    def start(self, plan: RunPlan, train: Any, planned: threading.Event,
              ended: threading.Event) -> "RayExecutor | None":
        """The run's executor on Ray (None: the run ``ended`` first and needs none). ``planned`` is set once
        the run is planned (partition, σ calibration, model) or has ended: Ray's processes start after it,
        so that they do not compete with the planning for the cores while the first clients wait."""
        ...

    def end(self, remote: "RayExecutor | None", ok: bool) -> None:
        """The run has ended (``ok``: completed): release what :meth:`start` took."""
        ...


class LocalRay:
    """The Ray side of a ``raysim run``: a fresh local Ray, started on the head start's thread, and the
    run's own actors; shut down when the run ends."""

    #: The starting thread stays alive until Ray is shut down: the kernel ends Ray's processes when the
    #: thread that started them exits (Ray asks for that with ``PR_SET_PDEATHSIG``, which follows the
    #: parent thread), and Ray then takes seconds to shut down.
    parks = True

    def start(self, plan: RunPlan, train: Any, planned: threading.Event,
              ended: threading.Event) -> "RayExecutor | None":
        from raysim.runtime.driver import init_ray
        from raysim.runtime.ray_executor import RayExecutor
        planned.wait()
        if ended.is_set():
            return None
        init_ray(None)
        remote = RayExecutor()
        remote.start(plan, train)
        return remote

    def end(self, remote: "RayExecutor | None", ok: bool) -> None:
        import ray
        ray.shutdown()


class HeadStartExecutor:
    """Trains here until the Ray actors that ``ray_side`` starts are warm, then on them (module docstring)."""

    def __init__(self, ray_side: RaySide | None = None) -> None:
        self.side = ray_side if ray_side is not None else LocalRay()
        self.runner: ClientRunner | None = None
        self.remote: RayExecutor | None = None
        self.on_ray = False
        #: the runs row's placement fields, updated as the run goes (head_start_clients: clients trained here)
        self.placement: dict[str, Any] = {"warm_actors": False, "head_start_clients": 0}
        self._started = threading.Event()
        self._planned = threading.Event()   # the run is planned (or has ended): the Ray side may start Ray
        self._ended = threading.Event()     # the run has ended: a Ray side not started yet need not start
        self._release = threading.Event()   # set once the Ray side has ended: a parked starting thread may end
        self._start_error: BaseException | None = None

    def start(self, plan: RunPlan, train: Any) -> None:
        self.plan, self.cfg, self.train = plan, plan.cfg, train
        self.runner = ClientRunner(plan.cfg, plan.clipping, train)
        threading.Thread(target=self._start_ray, name="raysim-ray-start", daemon=True).start()

    def _start_ray(self) -> None:
        """Have the Ray side start the run's actors; then stay alive until the run ends if it must
        (:attr:`LocalRay.parks`)."""
        try:
            self.remote = self.side.start(self.plan, self.train, self._planned, self._ended)
        except BaseException as exc:   # raised in the training thread by _on_ray
            self._start_error = exc
        finally:
            self._started.set()
        if self.side.parks:
            self._release.wait()

    def ready(self) -> None:
        """Nothing to wait for: the first clients train here. The run is planned: Ray may start."""
        self._planned.set()

    @property
    def overlaps(self) -> bool:
        """Round t+1 trains while round t is evaluated once the clients train on Ray."""
        return self.on_ray

    def submit(self, payload: RoundPayload, tasks: Sequence[ClientTask], clients: Sequence[ClientData],
               fold: Sequence[float] | None = None) -> Any:
        """On Ray once the actors are warm (folding the updates if ``fold``, :meth:`RayExecutor.submit`), else here."""
        if self._on_ray():
            return "ray", self.remote.submit(payload, tasks, clients, fold)
        return "here", (payload, tasks, clients)

    def take_sum(self) -> Any:
        """The sum of the round just collected if Ray folded its updates, else None."""
        return self.remote.take_sum() if self.remote is not None else None

    def collect(self, handle: Any) -> list[ClientResult]:
        """The results of :meth:`submit`, sorted by client id: a round submitted before the actors were
        warm trains here, client after client, until they are, and its remaining clients on them."""
        kind, work = handle
        if kind == "ray":
            return self.remote.collect(work)
        assert self.runner is not None, "start() first"
        payload, tasks, clients = work
        results = []
        for j in range(len(tasks)):
            if self._on_ray():
                results += self.remote.collect(self.remote.submit(payload, tasks[j:], clients[j:]))
                break
            results.append(self.runner.train(payload, tasks[j], clients[j]))
            self.placement["head_start_clients"] += 1
        return sorted(results, key=lambda r: r.client_id)

    def _on_ray(self) -> bool:
        """Whether the clients now train on Ray (the actors are warm); raises what starting Ray failed with."""
        if self.on_ray or not self._started.is_set():
            return self.on_ray
        if self._start_error is not None:
            raise RuntimeError(f"starting the run's Ray actors failed: {self._start_error}") from self._start_error
        if self.remote is not None and self.remote.poll():
            self.on_ray = True
            self.placement.update(self.remote.run_placement())
        return self.on_ray

    def evaluate(self, weights: Any, x: Any, y: Any, num_classes: int, idle: bool = False) -> Any:
        if self._on_ray():
            return self.remote.evaluate(weights, x, y, num_classes, idle)
        assert self.runner is not None, "start() first"
        return self.runner.evaluate(weights, x, y, num_classes) if eval_where(self.cfg) == "actor" else None

    def shutdown(self, ok: bool = False) -> None:
        """End the run's Ray side (once started: a run may end before Ray is up): shut down the Ray a
        ``raysim run`` started, or give a sweep's pool its actors back (``ok``: the run completed).
        Once: a second call would shut down whatever Ray this process has joined since."""
        if self._ended.is_set():
            return
        self._ended.set()
        self._planned.set()
        self._started.wait()
        try:
            self.side.end(self.remote, ok)
        finally:
            self._release.set()
        self.remote = self.runner = None
        self.on_ray = False


class _Rounds:
    """The round records; the run's Ray is shut down when the stream ends or is closed, once."""

    def __init__(self, sim: Simulation, executor: HeadStartExecutor) -> None:
        self.sim, self.executor = sim, executor
        self.stream = self._stream()

    def __iter__(self) -> Iterator[RoundRecord]:
        return self.stream

    def _stream(self) -> Iterator[RoundRecord]:
        ok = False
        try:
            yield from self.sim.run()
            ok = True
        finally:
            self.executor.shutdown(ok)

    def close(self) -> None:
        self.stream.close()          # a stream that has started ends (and shuts down) here…
        self.executor.shutdown()     # …one that never started is shut down here


class HeadStartHost:
    """Runs the simulation in this process, its clients here until the actors of its Ray side
    (default :class:`LocalRay`) are warm."""

    def __init__(self, ray_side: RaySide | None = None) -> None:
        self.ray_side = ray_side

    def start(self, plan: RunPlan, train: Any, test: Any, resume: bytes | None = None,
              state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        executor = HeadStartExecutor(self.ray_side)
        sim = Simulation(plan, train, test, executor, state_dir=state_dir)
        if resume is not None:
            sim.restore(resume)
        return sim.setup, _Rounds(sim, executor), executor.placement
