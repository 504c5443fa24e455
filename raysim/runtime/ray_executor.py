"""Ray executor: a fixed pool of client actors with fractional CPU/GPU resources.

The pool has ``runtime.num_actors`` actors (default: as many as run at once on the cluster, at
most one per client). Every actor can train every client: the run's train arrays are put into
the object store once, so each node holds one copy that its actors read without copying, and a
task names its client's shard (indices), whose rows the actor normalises to floats the first time
it needs them and keeps (:meth:`raysim.client.ClientRunner.rows`). Each round the payload (global
model, broadcast state) is ``ray.put`` once; the round's clients are balanced over as many actors
per node as the run holds CPUs there, largest shard first, and each of those actors trains its
share in one task, or, where the server reads the updates only through their weighted sum, in calls
of decreasing size whose updates the driver folds into that sum as they arrive, an actor that runs
out of work taking over another's waiting calls (:meth:`RayExecutor.submit`).
After the last round the idle actors evaluate a part of the test set each (:meth:`RayExecutor.evaluate`).

Actors restart on failure (``max_restarts``) and Ray retries their in-flight tasks
(``max_task_retries``); because client state lives on the server and every random stream is
keyed by (round, client), a retried task, or one run on another actor, returns exactly the same
result.

The actor class lives in :mod:`raysim.runtime.client_actor`, which imports no torch until a task
needs it; ``tests/integration/test_actor_startup.py`` checks ``sys.modules`` inside an actor.
"""

from __future__ import annotations

import itertools
import json
import math
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import ray
import torch

from raysim.algorithms.flat import Sum64
from raysim.client import eval_where
from raysim.run_plan import RunPlan
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload
from raysim.metrics import summarize
from raysim.runtime.client_actor import actor_count, cpus_per_actor, first_active, start_client_actors


def placement_row(placements: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Where a run executes, as the runs table records it: the node ids of its client actors (JSON list,
    actor order; ``placements`` as :meth:`RayExecutor.placements` gives them) and of this process, which
    writes the rows."""
    return {"client_nodes": json.dumps([p["node_id"] for p in placements]),
            "writer_node": ray.get_runtime_context().get_node_id()}


@dataclass
class _Folded:
    """A round submitted with ``fold`` (:meth:`RayExecutor.submit`): each outstanding call's actor and
    task positions, each active actor's outstanding calls in the order it runs them, each client's
    weight, and what a call needs to be made again on another actor (:meth:`RayExecutor._steal`)."""

    calls: dict[Any, tuple[int, list[int]]]
    queues: list[list[Any]]
    weights: dict[int, float]
    actors: list[Any]
    args: tuple[Any, list[ClientTask], list[ClientData], Any]

    @property
    def refs(self) -> list[Any]:
        return list(self.calls)

    def call(self, k: int, part: list[int]) -> Any:
        """Train the tasks at positions ``part`` on active actor ``k``; the call joins its queue."""
        payload_ref, tasks, clients, setup_ref = self.args
        ref = self.actors[k].train_apart.remote(payload_ref, [tasks[j] for j in part], [clients[j] for j in part],
                                                setup_ref)
        self.calls[ref] = (k, part)
        self.queues[k].append(ref)
        return ref


def fold_chunks(share: list[int], split: int) -> list[list[int]]:
    """``share`` (one actor's task positions, in client-id order) cut into calls of decreasing size, each
    ⌈remaining / split⌉: the first calls are long (few calls per round), the last ones one or two clients
    (a call that an idle actor takes over is short)."""
    out, lo = [], 0
    while lo < len(share):
        size = -(-(len(share) - lo) // split)
        out.append(share[lo:lo + size])
        lo += size
    return out


class RayExecutor:
    """Executor over a pool of Ray actors; ``placement_group`` (optional) co-locates a run's actors,
    ``actors`` (optional) are actors already started on the same data (a sweep's warm pool), or just
    created by that pool when ``cold``: they are then waited for and warmed as the executor's own."""

    def __init__(self, placement_group: Any = None, actors: Sequence[Any] = (), cold: bool = False) -> None:
        self.actors: list[Any] = list(actors)
        self.cold = cold or not self.actors
        self.placement_group = placement_group
        self.train_ref: list | None = None
        self._pending: list[Any] = []

    def start(self, plan: RunPlan, train: Any) -> None:
        """Ask Ray for the actors (or re-target the given ones) and return at once: they start while
        the server plans the run."""
        train_ref = train if isinstance(train, list) else [ray.put(train)]
        # Held for the executor's lifetime: an actor Ray restarts fetches the arrays again through the
        # setup of its next task, so they must still exist in the object store then.
        self.train_ref = train_ref
        self.setup_ref = ray.put((uuid.uuid4().hex, plan, train_ref))
        cfg = plan.cfg
        self._active: list[Any] | None = None
        self.gpu = cfg.runtime.num_gpus_per_client > 0
        self.cpus = cpus_per_actor(cfg, len(self.actors) or actor_count(cfg))
        self.eval_on = eval_where(cfg)
        self.eval_auto = cfg.runtime.eval_on == "auto"
        self.eval_batch_size = cfg.eval_batch_size
        # id(x) -> (x, the object refs of its parts, one per evaluating actor): x is kept so that its id
        # cannot be reused by another array
        self._eval_sets: dict[int, tuple[Any, Any]] = {}
        self._warming: list[Any] = []
        self.sum_updates = cfg.runtime.sum_on_actors
        self._total: Any = None
        if not self.actors:
            self.actors = start_client_actors(cfg, self.placement_group)
        if self.cold:
            self._pending = [a.ready.remote() for a in self.actors]
            # The actors that train when they all land on one node (active_actors, which must wait for
            # them to start to know their nodes) warm up now: they import torch and build the run's
            # model while this process plans the run, not after.
            self._warming = [a.warm.remote(self.setup_ref) for a in first_active(cfg, self.actors)]

    def ready(self) -> None:
        """Block until every actor has started and the active ones (:meth:`active_actors`) have
        imported the training side and built the run's model; the others stay light until a task
        reaches them (see :mod:`raysim.runtime.client_actor`). A second ``warm`` of an actor that is
        warm already returns at once."""
        if self._pending:
            ray.get(self._pending)
            self._pending = []
            ray.get(self._warming + [a.warm.remote(self.setup_ref) for a in self.active_actors()])
            self._warming = []

    def poll(self) -> bool:
        """Whether :meth:`ready` would return without waiting (every actor started, the active ones
        warm); raises what an actor failed with."""
        if not self._pending:
            return True
        waiting = self._pending + self._warming
        done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        if len(done) < len(waiting):
            for ref in done:
                ray.get(ref)   # an actor that failed to start or warm fails the run now
            return False
        self.ready()
        return True

    #: Clients train in other processes: the simulation evaluates round t while round t+1 trains.
    overlaps = True

    def submit(self, payload: RoundPayload, tasks: Sequence[ClientTask], clients: Sequence[ClientData],
               fold: Sequence[float] | None = None) -> "list[Any] | _Folded":
        """Start training ``tasks`` (``clients[j]`` is the shard of ``tasks[j]``); returns the task refs.

        The round's clients are split over the *active* actors (:meth:`active_actors`: as many per
        node as the CPUs the run's actors hold there), largest shard first onto the least loaded
        actor, and each active actor gets its whole share in one call. More CPU-bound processes
        than cores only time-slice them, and one call per actor pays Ray's per-task cost once.

        With ``fold`` (the weight w_j of ``tasks[j]``'s update, :meth:`raysim.algorithms.base.Server.fold_weights`),
        and not under ``runtime.sum_on_actors``, :meth:`collect` folds the updates into Σ_j w_j Δ_j as
        they arrive (:meth:`take_sum`): each actor trains its share in client-id order, in calls of
        decreasing size (:func:`fold_chunks`), so that the driver adds the first clients' updates while
        the actors train the rest, reading each Δ_j in place from the object store, and an actor that
        runs out of work takes over another's last waiting call (:meth:`_steal`)."""
        self.ready()
        payload_ref = ray.put(payload)
        active = self.active_actors()
        shares = self.balance(clients, len(active))
        if fold is not None and not self.sum_updates:
            handle = _Folded({}, [[] for _ in active], {t.client_id: float(w) for t, w in zip(tasks, fold)},
                             active, (payload_ref, list(tasks), list(clients), self.setup_ref))
            for k, share in enumerate(shares):
                for part in fold_chunks(sorted(share, key=lambda j: tasks[j].client_id), self.FOLD_SPLIT):
                    handle.call(k, part)
            return handle
        return [active[k].train_many.remote(payload_ref, [tasks[j] for j in share], [clients[j] for j in share],
                                            self.setup_ref, self.sum_updates) for k, share in enumerate(shares) if share]

    def collect(self, refs: "list[Any] | _Folded") -> list[ClientResult]:
        """The results of :meth:`submit`, sorted by client id. Under ``runtime.sum_on_actors`` each actor
        returned its share's sum with its results; the shares' sums are added in actor order (:meth:`take_sum`)."""
        if isinstance(refs, _Folded):
            return self._collect_folded(refs)
        batches = ray.get(refs)
        if self.sum_updates:
            total = batches[0][1].copy()   # the others are read in place from the object store
            for _, part in batches[1:]:
                total += part
            self._total = torch.from_numpy(total)
            batches = [results for results, _ in batches]
        return sorted((r for batch in batches for r in batch), key=lambda r: r.client_id)

    #: An actor's share of a folded round goes out in calls of ⌈remaining / FOLD_SPLIT⌉ clients (:func:`fold_chunks`).
    FOLD_SPLIT = 3

    def _collect_folded(self, handle: "_Folded") -> list[ClientResult]:
        """:meth:`collect` of a round submitted with ``fold``: each update is added to the float64 sum as
        soon as every update before it in client-id order has been (:class:`raysim.algorithms.flat.Sum64`),
        so the sum has :func:`raysim.algorithms.flat.sum64`'s bits over the whole cohort, whichever
        actor trained each client."""
        weights = handle.weights
        order = sorted(weights)
        arrived, results, total = {}, [], None
        while handle.calls:
            done, _ = ray.wait(list(handle.calls), num_returns=1)
            k, _part = handle.calls.pop(done[0])
            handle.queues[k].remove(done[0])
            arrived.update((r.client_id, (r, delta)) for r, delta in ray.get(done[0]))
            if not handle.queues[k]:
                self._steal(handle, k)
            ready = [arrived.pop(c) for c in itertools.takewhile(arrived.__contains__, order[len(results):])]
            if ready:
                with warnings.catch_warnings():   # the arrays are read-only: Δ is only read, never written
                    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                    deltas = [torch.from_numpy(delta) for _, delta in ready]
                total = total if total is not None else Sum64(deltas[0])
                total.add(deltas, [weights[r.client_id] for r, _ in ready])
                results += [r for r, _ in ready]
        self._total = total.out if total is not None else None
        return results

    @staticmethod
    def _steal(handle: "_Folded", idle: int) -> bool:
        """Active actor ``idle`` has no call left: it takes over the last waiting call (queued behind the
        one running) of the actor with the most clients waiting, and that call is cancelled (an actor
        runs its calls one at a time, in order, so a queued call has not started). A client's result
        does not depend on the actor that trains it (every stream is keyed by round and client), so the
        round's bits do not change; were the cancelled call to run all the same, its result is not read.
        Whether a call moved."""
        waiting = [(sum(len(handle.calls[ref][1]) for ref in queue[1:]), j)
                   for j, queue in enumerate(handle.queues) if len(queue) > 1]
        if not waiting:
            return False
        _, j = max(waiting)
        ref = handle.queues[j].pop()
        _, part = handle.calls.pop(ref)
        ray.cancel(ref)
        handle.call(idle, part)
        return True

    def take_sum(self) -> Any:
        total, self._total = self._total, None
        return total

    def balance(self, clients: Sequence[ClientData], num_actors: int) -> list[list[int]]:
        """The positions of ``clients`` each of ``num_actors`` actors trains: largest shard first, each onto
        the least loaded actor (shard size plus :data:`FIXED_COST` a client)."""
        shares: list[list[int]] = [[] for _ in range(num_actors)]
        load = [0.0] * num_actors
        for j in sorted(range(len(clients)), key=lambda j: (-len(clients[j].train_indices), j)):
            k = min(range(num_actors), key=lambda a: (load[a], a))
            shares[k].append(j)
            load[k] += len(clients[j].train_indices) + self.FIXED_COST
        return shares

    #: Shard-size units added per client when balancing: a client's fixed cost per round (model set-up,
    #: uploads) in examples' worth, fitted on the digits quickstart (a client's round time against n_i);
    #: on CIFAR-10 an example costs more and the fixed part weighs less.
    FIXED_COST = 16

    def active_actors(self) -> list[Any]:
        """The actors a round uses: on each node, as many as the CPUs the run's actors hold there
        (at least one; shares are rounded down to 4 decimals, so 3 × 0.6666 counts as 2); all of
        them when clients have GPU shares."""
        if self._active is None:
            if self.gpu:
                self._active = list(self.actors)
            else:
                where = ray.get([a.where.remote() for a in self.actors])
                by_node: dict[str, list[int]] = {}
                for k, w in enumerate(where):
                    by_node.setdefault(w["node_id"], []).append(k)
                self._active = [self.actors[k] for ks in by_node.values()
                                for k in ks[:max(1, math.floor(len(ks) * self.cpus + 0.05))]]
        return self._active

    def evaluate(self, weights: Any, x: Any, y: Any, num_classes: int, idle: bool = False) -> Any:
        """With ``runtime.eval_on=actor``, or with ``auto`` while no round trains (``idle``: after the
        last round), the active actors evaluate, each a contiguous run of whole ``eval_batch_size``
        batches, and the parts are summed in order: the same bits as the driver's evaluation at the
        same thread count (:func:`raysim.metrics.eval_batches`). Else None: the driver evaluates."""
        if not (self.eval_on == "actor" or (idle and self.eval_auto)):
            return None
        actors = self.active_actors()
        batches = math.ceil(len(y) / self.eval_batch_size)
        cuts = [self.eval_batch_size * (batches * k // len(actors)) for k in range(len(actors) + 1)]
        if id(x) not in self._eval_sets:   # the test split, and the validation hold-out if any; put once per run
            parts = [ray.put((x[lo:hi], y[lo:hi])) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
            self._eval_sets[id(x)] = (x, parts)
        weights_ref = ray.put(weights)
        done = ray.get([a.evaluate.remote(weights_ref, part, self.setup_ref)
                        for a, part in zip(actors, self._eval_sets[id(x)][1])])
        preds = [p for _, p in done]
        return summarize([loss for losses, _ in done for loss in losses],
                         torch.cat(preds) if preds else torch.zeros(0, dtype=torch.int64), y, num_classes)

    def placements(self) -> list[dict[str, Any]]:
        return ray.get([a.where.remote() for a in self.actors])

    def run_placement(self) -> dict[str, str]:
        """:func:`placement_row` of this executor's actors, for a run whose rows this process writes."""
        return placement_row(self.placements())

    def detach(self) -> list[Any]:
        """Hand the actors over (to a sweep's warm pool) instead of killing them at shutdown."""
        actors, self.actors = self.actors, []
        return actors

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        self.train_ref = None
