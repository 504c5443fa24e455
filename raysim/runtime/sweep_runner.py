"""Run many experiments at once on one Ray cluster, with Ray Core (see docs/cluster.md for why not Tune).

By default the runs borrow their driver and client actors from a warm pool
(:mod:`raysim.runtime.pool`): runs on the same data reuse actors that are already running, so
only the first run of each kind pays for starting processes. With ``reuse_actors=False`` each
run gets a placement group (one bundle per client actor, strategy PACK) that holds its fresh
driver and client actors. The run itself, the ``run_experiment`` call that streams rows into
the results folder, is a zero-CPU task pinned to the node of the sweep's driver (the head node
under ``ray job submit``), so every row is written by one machine into one folder while the
actors are spread over the cluster. At most ``max_concurrent`` placement groups are requested at
a time; Ray reserves those that fit and the sweep starts a run when its group is ready.

A sweep that starts its own local Ray does not wait for it to begin: its first run starts at once
in a thread of this process with a head start (:func:`first_run_head_starts`, :class:`SweepRay`,
:mod:`raysim.runtime.head_start`). It trains its first clients here while the main thread
starts Ray and the pool, then moves to actors from the pool like any other run.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.config import Config
from raysim.run_plan import RunPlan
from raysim.runtime import head_starts
from raysim.runtime.driver import init_ray
# Imported here, not where it is used: in a Ray job's entrypoint, a module first imported after
# ray.init() is not found in the job's working_dir (measured with `ray job submit --working-dir .`).
from raysim.runtime.pool import ActorPool
from raysim.runtime.client_actor import actor_count, cpus_per_actor

if TYPE_CHECKING:
    from raysim.runtime.ray_executor import RayExecutor

__all__ = ["KeptPool", "RunOutcome", "SweepListener", "run_sweep", "size_run"]


@dataclass
class RunOutcome:
    run_id: str
    status: str                      # completed | failed
    row: dict[str, Any] | None = None
    error: str | None = None


class SweepListener(Protocol):
    def started(self, run_id: str) -> None: ...
    def finished(self, outcome: RunOutcome) -> None: ...
    def tick(self, queued: int) -> None: ...   # runs not started yet


@dataclass
class _Planned:
    run: RunPlan
    bundles: list[dict[str, float]]   # empty: serial executor, the run task holds the CPUs itself
    demand: dict[str, float]


def size_run(plan: RunPlan) -> _Planned:
    """Fix the run's per-actor CPUs (so the actors ask for exactly what the bundles hold) and its bundles."""
    r = plan.cfg.runtime
    if r.executor == "serial":
        return _Planned(plan, [], {"CPU": float(r.torch_threads)})
    num_actors = actor_count(plan.needs)
    cpus = cpus_per_actor(plan.needs, num_actors)
    plan = plan.with_runtime(dataclasses.replace(r, num_cpus_per_client=cpus))
    bundle = {"CPU": cpus, **({"GPU": r.num_gpus_per_client} if r.num_gpus_per_client > 0 else {})}
    return _Planned(plan, [dict(bundle) for _ in range(num_actors)], {k: v * num_actors for k, v in bundle.items()})


def _fits(plan: _Planned, totals: dict[str, float]) -> bool:
    return all(totals.get(k, 0.0) + 1e-9 >= v for k, v in plan.demand.items())


def default_concurrency(plans: Sequence[_Planned], totals: dict[str, float]) -> int:
    """How many of the largest runs fit the cluster's current resources at once (at least 1)."""
    fit = math.inf
    for plan in plans:
        for k, v in plan.demand.items():
            if v > 0:
                fit = min(fit, totals.get(k, 0.0) // v)
    return int(max(1, fit if math.isfinite(fit) else 1))


#: How a sweep runs one experiment: ``run_one(plan, results_dir, sweep_id=..., placement_group=...)``
#: returns the final runs row (with ``pool=`` when actors are pooled, and ``head_start=`` for a
#: head-start first run). The sweep receives it (``raysim.runtime.execute_row``, adapted by the CLI)
#: instead of importing the experiment module.
RunOne = Callable[..., dict[str, Any]]


def first_run_head_starts(cfg: Config, address: str | None) -> bool:
    """Whether the sweep's first run starts in this process while the sweep starts its own local Ray:
    where a ``raysim run`` of it would (:func:`raysim.runtime.head_starts`) and the sweep joins no Ray."""
    return cfg.runtime.executor == "ray" and not address and head_starts(cfg)


class SweepRay:
    """The Ray side of a sweep's first run: the Ray that the sweep's main thread starts (:meth:`attach`
    once it is up) and actors borrowed from the sweep's pool, which get them back when the run ends."""

    parks = False

    def __init__(self) -> None:
        #: set when the run asks for its actors (it is planned: data, partition, σ calibration): the
        #: sweep starts Ray then, so that Ray's start does not compete with the run's planning
        self.wanted = threading.Event()
        self._up = threading.Event()
        self.pool: Any = None
        self._error: BaseException | None = None
        self._lent: tuple[Any, list[Any]] | None = None

    def attach(self, pool: Any) -> None:
        """The sweep's Ray is up; ``pool`` lends the actors (None: fresh actors, killed at the end)."""
        self.pool = pool
        self._up.set()

    def fail(self, error: BaseException) -> None:
        """The sweep's Ray could not be started: the run fails with ``error`` instead of waiting."""
        self._error = error
        self._up.set()

    def start(self, plan: RunPlan, train: Any, planned: threading.Event,
              ended: threading.Event) -> "RayExecutor | None":
        """The run's executor on the sweep's Ray, once the run is planned and that Ray is up; None if the
        run ``ended`` meanwhile (it borrows no actors then)."""
        from raysim.runtime.ray_executor import RayExecutor
        planned.wait()
        self.wanted.set()
        self._up.wait()
        if self._error is not None:
            raise self._error
        if ended.is_set():
            return None
        plan = size_run(plan).run   # the per-actor CPUs the sweep's other runs of this kind ask for
        if self.pool is None:
            remote = RayExecutor()
            remote.start(plan, train)
            return remote
        needs = plan.needs
        driver, actors, warm = ray.get(self.pool.acquire.remote(needs))
        self._lent = (driver, actors)
        has_data = ray.get(self.pool.has_data.remote(needs))
        train_ref = ray.get(self.pool.data.remote(needs, None if has_data else [ray.put(train)]))
        remote = RayExecutor(None, actors, cold=not warm)
        remote.start(plan, train_ref)
        return remote

    def end(self, remote: "RayExecutor | None", ok: bool) -> None:
        """Return the borrowed actors to the pool (kill them after a failure, or without a pool)."""
        if self._lent is None:
            if remote is not None:
                remote.shutdown()
            return
        driver, actors = self._lent
        self._lent = None
        if remote is not None:
            remote.detach()
        if ok:
            ray.get(self.pool.release.remote(driver, actors))
            return
        for handle in [driver, *actors] if driver is not None else actors:
            ray.kill(handle)
        ray.get(self.pool.discard.remote([driver, *actors]))


class _FirstRun:
    """The sweep's first run, in a thread of this process with a head start (module docstring)."""

    def __init__(self, run_one: RunOne, plan: RunPlan, results_dir: str, sweep_id: str) -> None:
        self.plan = plan
        self.ray_side = SweepRay()
        self.done = threading.Event()
        self.row: dict[str, Any] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(run_one, results_dir, sweep_id), name="raysim-first-run",
                         daemon=True).start()

    def _run(self, run_one: RunOne, results_dir: str, sweep_id: str) -> None:
        try:
            self.row = run_one(self.plan, results_dir, sweep_id=sweep_id, head_start=self.ray_side)
        except BaseException as exc:   # reported by the sweep's loop, like a run task's error
            self.error = exc
        finally:
            self.done.set()


@ray.remote(num_cpus=0, max_retries=0)
def _run_task(run_one: RunOne, plan: RunPlan, results_dir: str, sweep_id: str, pg: Any, pool: Any) -> dict[str, Any]:
    if pool is None:
        return run_one(plan, results_dir, sweep_id=sweep_id, placement_group=pg)
    return run_one(plan, results_dir, sweep_id=sweep_id, placement_group=pg, pool=pool)


class KeptPool:
    """A warm-actor pool kept across several sweeps of one process (the stages of a tune), so a later
    sweep borrows the actors an earlier one left warm. Started by the first sweep that lends actors;
    :meth:`close` ends it and its actors."""

    def __init__(self) -> None:
        self.handle: Any = None

    def lend(self, pin: Any) -> Any:
        if self.handle is None:
            self.handle = ActorPool.options(scheduling_strategy=pin).remote()
        return self.handle

    def close(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            try:
                ray.get(handle.shutdown.remote())
            finally:
                ray.kill(handle)


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)   # RayTaskError wraps what the run raised
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _record_failure(results_dir: str, plan: RunPlan, sweep_id: str, error: str) -> dict[str, Any]:
    """A run that died, or failed before writing its first row (e.g. its data could not be
    partitioned), cannot record its own failure; the sweep does, on the same node."""
    from raysim.results import ResultsSink
    from raysim.results.rows import run_row
    sink = ResultsSink(results_dir)
    row = sink.read_run(plan.run_id)
    if row is None:
        row = run_row(plan, sweep_id, "failed")
    if row.get("status") != "completed":
        row.update(status="failed", error=error)
        sink.write_run(row)
    return row


def _notify(call: Callable[..., None], *args: Any) -> None:
    """Call a progress listener; a display error is printed, never allowed to stop the sweep."""
    try:
        call(*args)
    except Exception as exc:
        print(f"raysim: warning: progress display: {_error_text(exc)}", file=sys.stderr, flush=True)


def _lost_to_the_cluster(exc: BaseException) -> bool:
    """The run died with its node, its actors or their objects (not a user error, not a diverged run)."""
    from ray import exceptions as rex
    system = (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError, rex.OwnerDiedError,
              rex.NodeDiedError, rex.LocalRayletDiedError, rex.RaySystemError)
    return any(isinstance(e, system) for e in (exc, getattr(exc, "cause", None)))


def run_sweep(plans: Sequence[RunPlan], results_dir: str, sweep_id: str, *, run_one: RunOne,
              address: str | None = None, retries: int = 2, reuse_actors: bool = True,
              max_concurrent: int | None = None, listener: SweepListener | None = None,
              poll_seconds: float = 1.0, kept_pool: KeptPool | None = None) -> list[RunOutcome]:
    """Run the planned runs ``plans`` in parallel; returns one outcome per run, in completion order.

    A failing run does not stop the others. A run lost to the cluster (its node died, its actors or
    their objects were lost) is started again, up to ``retries`` times, and resumes from its last
    checkpoint, so its tables end as if nothing had happened; any other failure is recorded as is.
    ``max_concurrent`` bounds the placement groups in
    flight (default: as many of the largest runs as fit the cluster's current resources); groups
    that do not fit wait in Ray's queue, where an autoscaling cluster sees them and grows.
    ``reuse_actors`` lends runs warm actors from a pool (see the module docstring); ``run_one`` is
    then also given ``pool=``. The pool ends with the sweep, unless it is ``kept_pool``'s, which the
    caller closes.
    """
    first = None
    if plans and first_run_head_starts(plans[0].cfg, address):
        first = _FirstRun(run_one, plans[0], results_dir, sweep_id)
        if listener:
            _notify(listener.started, first.plan.run_id)
    try:
        if first is not None:   # Ray starts once the first run is planned (SweepRay.wanted)
            while not (first.ray_side.wanted.wait(0.05) or first.done.is_set()):
                pass
        init_ray(address)
        here = ray.get_runtime_context().get_node_id()
        pin = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        sized = [size_run(p) for p in plans]
        totals = {k: float(v) for k, v in ray.cluster_resources().items()}
        cap = max_concurrent or default_concurrency(sized, totals)
        keeper = kept_pool if kept_pool is not None else KeptPool()
        pool = keeper.lend(pin) if reuse_actors and any(s.bundles for s in sized) else None
    except BaseException as exc:
        if first is not None:
            first.ray_side.fail(exc)
        raise
    if first is not None:
        first.ray_side.attach(pool)
        first_plan: _Planned | None = sized[0]
        queue = deque(sized[1:])
    else:
        first_plan = None
        queue = deque(sized)
    waiting: dict[Any, tuple[_Planned, Any]] = {}    # pg.ready() ref -> (plan, pg)
    running: dict[Any, tuple[_Planned, Any]] = {}    # run task ref -> (plan, pg or None)
    outcomes: list[RunOutcome] = []
    attempts: dict[str, int] = {}
    warned = False

    def launch(plan: _Planned, pg: Any) -> None:
        options: dict[str, Any] = {"scheduling_strategy": pin}
        if not plan.bundles:
            options["num_cpus"] = plan.demand["CPU"]
        ref = _run_task.options(**options).remote(run_one, plan.run, results_dir, sweep_id, pg,
                                                  pool if plan.bundles else None)
        running[ref] = (plan, pg)
        if listener:
            _notify(listener.started, plan.run.run_id)

    def finish(plan: _Planned, pg: Any, result: Callable[[], dict[str, Any]]) -> None:
        """Record the outcome of a run that ended (``result()`` returns its row or raises its error)."""
        run_id = plan.run.run_id
        retry = False
        try:
            outcome = RunOutcome(run_id, "completed", row=result())
        except Exception as exc:  # a failed run is reported, the sweep goes on
            error = _error_text(exc)
            row = _record_failure(results_dir, plan.run, sweep_id, error)
            outcome = RunOutcome(run_id, "failed", row=row, error=error)
            attempts[run_id] = attempts.get(run_id, 0) + 1
            retry = _lost_to_the_cluster(exc) and attempts[run_id] <= retries
            if retry:
                print(f"raysim: run {run_id} was lost to the cluster ({error}); resuming it from its last "
                      f"checkpoint (retry {attempts[run_id]} of {retries})", flush=True)
                queue.append(plan)
                if pool is not None:   # its actors may have died with a node: start the retry afresh
                    ray.get(pool.flush.remote())
        finally:
            if pg is not None:
                remove_placement_group(pg)
        if retry:
            return
        outcomes.append(outcome)
        if listener:
            _notify(listener.finished, outcome)

    def first_result() -> dict[str, Any]:
        assert first is not None
        if first.error is not None:
            raise first.error
        assert first.row is not None
        return first.row

    try:
        while queue or waiting or running or first_plan is not None:
            in_flight = len(waiting) + len(running) + (first_plan is not None)
            while queue and in_flight < cap:
                plan = queue.popleft()
                in_flight += 1
                if not _fits(plan, totals) and not warned:
                    warned = True
                    have = {k: totals.get(k, 0.0) for k in plan.demand}
                    print(f"raysim: a run needs {plan.demand} but the cluster has {have}; waiting for resources "
                          f"(an autoscaling cluster adds nodes; Ctrl-C to stop)", flush=True)
                if plan.bundles and pool is None:
                    pg = placement_group(plan.bundles, strategy="PACK")
                    waiting[pg.ready()] = (plan, pg)
                else:
                    launch(plan, None)
            if waiting or running:
                ready, _ = ray.wait([*waiting, *running], num_returns=1, timeout=poll_seconds)
            else:   # only the first run is in flight
                ready = []
                first.done.wait(poll_seconds)
            for ref in ready:
                if ref in waiting:
                    launch(*waiting.pop(ref))
                    continue
                plan, pg = running.pop(ref)
                finish(plan, pg, lambda: ray.get(ref))
            if first_plan is not None and first.done.is_set():
                plan, first_plan = first_plan, None
                finish(plan, None, first_result)
            if listener:
                _notify(listener.tick, len(waiting) + len(queue))
            totals = {k: float(v) for k, v in ray.cluster_resources().items()}
    except BaseException as exc:   # the sweep itself stops (Ctrl-C, a driver error): every unfinished run says why
        why = f"sweep aborted before this run finished ({_error_text(exc)}); rerun the sweep to resume it"
        unfinished = [p for p, _ in running.values()] + [p for p, _ in waiting.values()] + list(queue)
        for plan in unfinished + ([first_plan] if first_plan is not None else []):
            try:
                _record_failure(results_dir, plan.run, sweep_id, why)
            except Exception as record_exc:   # keep the original error; say what could not be recorded
                print(f"raysim: could not record the abort of {plan.run.run_id}: {_error_text(record_exc)}",
                      file=sys.stderr, flush=True)
        raise
    finally:
        if kept_pool is None:
            keeper.close()
    return outcomes
