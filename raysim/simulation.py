"""The one round loop, written against the executor interface.

``Simulation`` owns the server side of a run and yields one record per round; whoever drives it (the
CLI in-process, or the driver actor on Ray) writes the records. It delegates by concern: the process
settings (``raysim.allocator.configure_process``), the data set-up (``raysim.run_data``), the privacy
bookkeeping with its checkpoint state (``raysim.privacy.book``) and the rows (``raysim.results.rows``);
what stays here is the round itself: dispatch, collect, aggregate, account, evaluate, checkpoint.

Populations: what the server keeps per client is small (shard indices, σ_i and ε_i, a privacy ledger
created when the client first trains), model-sized client state goes to a
:class:`~raysim.state_store.ClientStateStore` that spills it to files, and a round touches only its
participants, so memory and round time do not grow with the number of clients that never train.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import pandas as pd
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from raysim.algorithms.base import MethodContext
from raysim.allocator import configure_process
from raysim.client import eval_where
from raysim.config import Config, ConfigError, client_mechanism
from raysim.data import ArrayDataset
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload
from raysim.metrics import Evaluation, evaluate
from raysim.models import count_parameters, init_parameters, model_for
from raysim.participation import participation_schedule
from raysim.privacy.accounting import PrivacyLedger
from raysim.privacy.book import PopulationBook, PrivacyBook, max_planned
from raysim.privacy.grad_sample import layer_slices
from raysim.privacy.plan import ParticipationPlan, not_covered
from raysim.privacy.population import client_level_plan
from raysim.results import rows
from raysim.rng import torch_generator
from raysim.run_data import prepare_run_data
from raysim.run_plan import RunPlan, plan_run
from raysim.state_store import ClientStateStore
from raysim.training import steps_per_epoch


#: Version of the checkpoint layout written by :meth:`Simulation.state`; a checkpoint of another version
#: is refused (the run restarts with ``--restart``), never migrated. Raise it whenever the layout
#: changes: version 2 records the release context (client device type, thread count); version 3 stores
#: each ledger's accountant as its ``Accountant.state()``.
CHECKPOINT_FORMAT = 3


class CheckpointError(ConfigError):
    """A checkpoint this code cannot resume from."""


def load_checkpoint(blob: bytes) -> dict[str, Any]:
    """The state in a checkpoint written by :meth:`Simulation.run`, refused if it has another format."""
    state = pickle.loads(blob)
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint format {version!r} is not {CHECKPOINT_FORMAT}; "
                              f"rerun with --restart to start this run from scratch")
    return state


class TrainingDiverged(RuntimeError):
    """A client update or the global model became non-finite (NaN/inf): the run cannot continue."""


class Executor(Protocol):
    """Where the clients of a run execute (serial in-process, or Ray actors)."""

    overlaps: bool
    """True when clients train in other processes, so that :meth:`Simulation.run` may evaluate
    round t while round t+1 trains."""

    def start(self, plan: RunPlan, train: Any) -> None:
        """Begin starting the workers; may return before they are ready (they start while the server plans)."""
    def ready(self) -> None:
        """Block until every worker can take tasks."""
    def submit(self, payload: RoundPayload, tasks: Sequence[ClientTask], clients: Sequence[ClientData],
               fold: Sequence[float] | None = None) -> Any:
        """Start training ``tasks`` (``clients[j]``: the shard of ``tasks[j]``); returns a handle for :meth:`collect`.
        ``fold``: the weight w_j of ``tasks[j]``'s update in the server's sum
        (:meth:`raysim.algorithms.base.Server.fold_weights`); an executor may fold the updates into
        Σ_j w_j Δ_j in client-id order as they arrive and return results without Δ (:meth:`take_sum`)."""
    def collect(self, handle: Any) -> list[ClientResult]:
        """The results of a :meth:`submit`, sorted by client id."""
    def take_sum(self) -> torch.Tensor | None:
        """The float64 Σ_i w_i Δ_i of the round just collected, whose results then carry no Δ: the workers'
        sums under ``runtime.sum_on_actors`` (:func:`raysim.algorithms.base.fold_updates`), or the updates
        folded as they arrived (``fold``); None if the results carry their updates."""
    def evaluate(self, weights: torch.Tensor, x: Any, y: torch.Tensor, num_classes: int, idle: bool = False) -> Any:
        """Evaluate the global model on the workers (``runtime.eval_on``; ``idle``: no round is training
        meanwhile; ``x``: uint8 images (N, H, W, C) or normalised float tensors), or return None to
        leave it to the server."""
    def shutdown(self) -> None: ...


@dataclass
class SetupRecord:
    """Facts fixed before round 1."""

    partition_stats: pd.DataFrame
    num_params: int
    clipping: str
    noise_multipliers: list[float]     # σ_i; NaN for clients not planned yet (partial participation plans lazily)
    not_covered_by_epsilon: str
    startup_seconds: float = 0.0       # Simulation construction until every worker is ready
    resumed_after: int = 0             # rounds restored from a checkpoint (0: a fresh run)

    @property
    def max_noise_multiplier(self) -> float:
        """The largest σ_i planned so far (NaN when none is: partial participation before round 1)."""
        return max_planned(np.asarray(self.noise_multipliers, dtype=np.float64))


@dataclass
class RoundRecord:
    server_round: int
    round_row: dict[str, Any]
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: bytes | None = None    # the state after this round (runtime.checkpoint_every), pickled
    # Client state files no later checkpoint names: delete them once ``checkpoint`` is durable.
    released_state_files: list[str] = field(default_factory=list)
    max_noise_multiplier: float = math.nan   # the largest σ_i planned so far (the runs table's noise_multiplier)
    rdp_epsilons: str | None = None   # last round of a DP run: the runs table's rdp_epsilons (see Simulation.rdp_epsilons)


@dataclass
class _Dispatched:
    """A round whose training was submitted."""

    server_round: int
    participants: list[int]
    clip: float | tuple[float, ...]
    tasks: list[ClientTask]
    handle: Any
    plan_seconds: float


@dataclass
class _Aggregated:
    """A round trained, aggregated and accounted for, not yet evaluated."""

    sent: _Dispatched
    results: list[ClientResult]
    agg: Any
    t0: float
    t1: float
    t2: float
    t3: float
    max_sigma: float


class Simulation:
    """One run's server side. Iterate :meth:`run` to execute it round by round."""

    def __init__(self, plan: RunPlan | Config, train: ArrayDataset, test: ArrayDataset, executor: Executor,
                 train_handle: Any = None, state_dir: str | None = None) -> None:
        """``plan``: the run's :class:`~raysim.run_plan.RunPlan` (a config is planned first). ``state_dir``:
        where large client states are spilled (the results folder's ``checkpoints/<run_id>/client_states``);
        None keeps them in memory."""
        started = time.perf_counter()
        self.state_dir = state_dir
        plan = self.run_plan = plan_run(plan)
        cfg = self.cfg = plan.cfg
        configure_process(cfg.runtime)
        self.spec = plan.spec
        self.clipping = plan.clipping
        self.executor = executor
        # The workers start (processes, imports, model) while this process partitions and calibrates σ.
        executor.start(plan, train if train_handle is None else train_handle)
        try:
            self._plan(cfg, train, test)
            executor.ready()
        except BaseException:
            executor.shutdown()
            raise
        self.setup.startup_seconds = time.perf_counter() - started

    def _plan(self, cfg: Config, train: ArrayDataset, test: ArrayDataset) -> None:
        data = prepare_run_data(cfg, train, test)
        self.clients = data.clients
        self.data = data
        self.val_x, self.val_y = data.val_x, data.val_y
        self.info = test.info
        n = data.num_samples
        self.steps = np.array([steps_per_epoch(int(k), cfg.batch_size) * cfg.local_epochs for k in n])
        self.mechanism = client_mechanism(cfg.privacy.mechanism)
        # Public schedule, drawn up front from the seed (raysim.participation).
        self.schedule = participation_schedule(cfg)
        self._strategies: dict[int, tuple[float, ...]] = {}   # the clients' step strategies, built as they first train
        if cfg.privacy.unit == "client":
            joint = [u.release for u in self.spec.uploads(cfg) if u.release.kind == "joint"]
            if len(joint) > 1:
                raise ConfigError(f"method {self.spec.name!r} declares {len(joint)} joint uploads; the client-level "
                                  f"plan accounts one (adaptive clipping's count)")
            count_std = (joint[0].noise_multiplier or None) if joint else None   # 0: the plan's default σ_b
            client_level = client_level_plan(cfg, self.spec.server.sigma_schedule(cfg), adaptive_count=bool(joint),
                                             count_std=count_std)
            self.privacy: PrivacyBook | PopulationBook = PopulationBook(client_level, cfg.num_clients, self.schedule)
        else:
            client_level = None
            # How each client's DP-SGD steps sample and are accounted: Poisson batches at q = B/n, one event a
            # step, or a correlated mechanism's cyclic groups of its examples (raysim.privacy.mechanisms).
            self.example_steps = [self.mechanism.example_steps(cfg, int(k), int(s)) for k, s in zip(n, self.steps)]
            self.privacy = PrivacyBook(self.spec, cfg, self.clipping, np.array([e.rate for e in self.example_steps]),
                                       np.array([e.events for e in self.example_steps]), self.schedule)
        self.full_participation = self.privacy.full_participation
        self.epsilon_scope = self.run_plan.epsilon_scope   # whose ε the rows carry
        self.model = model_for(cfg, train.info, self.spec.model_options(cfg))
        init_parameters(self.model, torch_generator(cfg.train_seed, "model-init"))
        with torch.no_grad():
            self.weights = parameters_to_vector(self.model.parameters()).detach().clone()
        holdout_f1 = self._holdout_scorer(train.info) if self.val_x is not None else None
        ctx = MethodContext(cfg, self.clipping, int(self.weights.numel()), layer_slices(self.model), n, self.steps,
                            self.privacy.sigmas, holdout_f1, client_level)
        self.server = self.spec.server(ctx)
        self.client_states = ClientStateStore(self.state_dir, keep_released=bool(cfg.runtime.checkpoint_every))
        self.completed_rounds = 0
        self._client_device: str | None = None   # the device type the clients trained on (release_context)
        self._resume_release: dict[str, Any] = {}   # the release context of the checkpoint resumed from
        self._inflight: _Dispatched | None = None   # round t+1, submitted while round t is evaluated (run)
        #: the client-level audit only (``raysim.audit_clients``): (t, round t's participants) -> the order in
        #: which round t's clients train, the participants and canary clients (ids >= num_clients, no data)
        self.extra_clients: Callable[[int, list[int]], list[int]] | None = None
        self.setup = SetupRecord(data.partition_stats, count_parameters(self.model), self.clipping,
                                 self.privacy.setup_sigmas(), not_covered(self.spec, cfg, self.clipping))

    # --- the privacy bookkeeping (raysim.privacy.book), as the simulation's own attributes
    @property
    def sigmas(self) -> np.ndarray:
        return self.privacy.sigmas

    @property
    def ledgers(self) -> dict[int, PrivacyLedger]:
        return self.privacy.ledgers

    @property
    def epsilons(self) -> np.ndarray:
        return self.privacy.epsilons

    @property
    def plan(self) -> ParticipationPlan | None:
        return self.privacy.plan

    def plan_clients(self, client_ids: Sequence[int]) -> None:
        self.privacy.plan_clients(client_ids)

    def ledger(self, client_id: int) -> PrivacyLedger:
        """Client ``client_id``'s ledger (an empty one, not kept, for a client that never trained)."""
        return self.privacy.ledger(client_id)

    def _holdout_scorer(self, info: Any):
        """macro-F1 of flat weights on the public hold-out (post-processing of DP outputs on public data)."""
        x, y = self.val_x, self.val_y
        scratch = model_for(self.cfg, info, self.spec.model_options(self.cfg))

        def score(weights: torch.Tensor) -> float:
            vector_to_parameters(weights.detach().clone(), scratch.parameters())
            return evaluate(scratch, x, y, info.num_classes, self.cfg.eval_batch_size).f1
        return score

    def run(self) -> Iterator[RoundRecord]:
        """Yield the records of the remaining rounds.

        When the executor trains elsewhere (``overlaps``: Ray) and round t's evaluation runs here,
        round t+1 is submitted before round t is evaluated: the clients train while this process
        evaluates. Round t+1 needs only what round t's aggregation left (weights, server and client
        states, the public schedule), never the evaluation, and its random streams are keyed by
        (round, client), so the results are the same bits as without the overlap; the checkpoint
        of round t is taken before round t+1 is submitted."""
        every = self.cfg.runtime.checkpoint_every
        for t in range(self.completed_rounds + 1, self.cfg.rounds + 1):
            done = self._train_and_aggregate(t)
            self.completed_rounds = t
            checkpoint, released = None, []
            if every and (t % every == 0 or t == self.cfg.rounds):
                checkpoint = pickle.dumps(self.state(), protocol=pickle.HIGHEST_PROTOCOL)
                released = self.client_states.released()
            if t < self.cfg.rounds and self.executor.overlaps and not self._evaluates_on_worker(t):
                self._inflight = self._dispatch(t + 1)
            record = self._finish(done, self.evaluate(t), self.validate(t))
            del done   # the round's results (model-sized deltas) must not live on while the next round's arrive
            record.checkpoint, record.released_state_files = checkpoint, released
            if t == self.cfg.rounds:
                record.rdp_epsilons = self.rdp_epsilons()
            yield record

    def rdp_epsilons(self) -> str | None:
        """The run's RDP curve at :data:`raysim.privacy.tuning.ORDERS` as JSON: the pointwise maximum over
        clients of each client's curve, or the population's under ``privacy.unit=client``; None without DP
        (or for client-level cohorts whose events are not Poisson-sampled Gaussians)."""
        if self.clipping == "none":
            return None
        from raysim.privacy.tuning import rdp_to_json
        curve = self.privacy.rdp_curve()
        return None if curve is None else rdp_to_json(curve)

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to continue bit for bit: every random stream is keyed by
        (seed, purpose, round, client), so no generator state is saved, only what was learned."""
        return {"format_version": CHECKPOINT_FORMAT, "release": self.release_context(),
                "completed_rounds": self.completed_rounds,
                "weights": self.weights.clone(), "server": self.server.state_dict(),
                "client_state_manifest": self.client_states.manifest(), **self.privacy.state()}

    def restore(self, blob: bytes) -> None:
        """Continue from a checkpoint written by :meth:`run` (rounds after it run next)."""
        state = load_checkpoint(blob)
        self._resume_release = dict(state["release"])
        self._check_release(self.release_context())
        self.completed_rounds = int(state["completed_rounds"])
        self.weights = state["weights"]
        self.server.load_state_dict(state["server"])
        self.client_states.load(state["client_state_manifest"])
        self.privacy.restore(state)
        self.setup.noise_multipliers = self.privacy.setup_sigmas()
        self.setup.resumed_after = self.completed_rounds

    def release_context(self) -> dict[str, Any]:
        """What changes the bits a round releases besides the config's result keys: the clients' device
        (the DP noise generator follows it; None until clients have reported) and the thread count."""
        return {"client_device": self._client_device, "torch_threads": self.cfg.runtime.torch_threads}

    def _check_release(self, now: dict[str, Any]) -> None:
        """Refuse to redo checkpointed rounds under another release context: a redone round would be a
        second, different release of data that the ledger counted once."""
        saved = self._resume_release
        for key, value in now.items():
            if value is not None and saved.get(key) is not None and saved[key] != value:
                raise CheckpointError(f"this run was checkpointed with {key}={saved[key]} and resumes with "
                                      f"{key}={value}, which would release its redone rounds with other noise; "
                                      f"resume it with {key}={saved[key]}, or rerun with --restart")

    def round(self, t: int) -> RoundRecord:
        """Round ``t`` from start to end: train, aggregate, account, evaluate (:meth:`run` overlaps rounds)."""
        return self._finish(self._train_and_aggregate(t), self.evaluate(t), self.validate(t))

    def _dispatch(self, t: int) -> "_Dispatched":
        """Plan round ``t``'s participants and submit their training."""
        t0 = time.perf_counter()
        participants = [int(c) for c in self.schedule[t - 1]]
        self.plan_clients(participants)
        t_plan = time.perf_counter() - t0
        clip = self.server.clip_norm(t)          # C^(t), before aggregation moves it
        tasks: list[ClientTask] = []
        handle = None
        order = self.extra_clients(t, participants) if self.extra_clients is not None else participants
        if order:
            payload = self.server.payload(t, self.weights)
            tasks = self._with_step_noise(self.server.tasks(t, self.client_states, participants))
            trained, shards = tasks, [self.clients[task.client_id] for task in tasks]
            if self.extra_clients is not None:   # canary clients: the round's task (C, lr scale), no data or state
                template = tasks[0] if tasks else self.server.tasks(t, self.client_states, [0])[0]
                by_id = {task.client_id: (task, shard) for task, shard in zip(tasks, shards)}
                for cid in order:
                    if cid not in by_id:
                        by_id[cid] = (dataclasses.replace(template, client_id=cid, client_state=None),
                                      ClientData(cid, np.zeros(0, np.int64), np.zeros(0, np.int64)))
                trained, shards = [by_id[c][0] for c in order], [by_id[c][1] for c in order]
            folds = self.spec.sums_updates and not self.cfg.runtime.sum_on_actors and self.extra_clients is None
            fold = self.server.fold_weights([len(c.train_indices) for c in shards]) if folds else None
            handle = self.executor.submit(payload, trained, shards, fold)
        return _Dispatched(t, participants, clip, tasks, handle, t_plan)

    def _with_step_noise(self, tasks: list[ClientTask]) -> list[ClientTask]:
        """The tasks with their clients' correlated step strategies (privacy.unit=example under a correlated
        ``privacy.mechanism``; each optimised for the client's steps over the whole run, when it first trains)."""
        if self.cfg.privacy.unit != "example" or not self.mechanism.correlated or self.clipping == "none":
            return tasks
        out = []
        for task in tasks:
            cid, steps = task.client_id, self.example_steps[task.client_id]
            if cid not in self._strategies:
                rounds = sum(int(np.any(r == cid)) for r in self.schedule)
                self._strategies[cid] = self.mechanism.client_strategy(self.cfg, rounds * int(self.steps[cid]),
                                                                       steps.bands)
            out.append(dataclasses.replace(task, step_strategy=self._strategies[cid], step_groups=steps.bands,
                                           step_rate=steps.rate))
        return out

    def _train_and_aggregate(self, t: int) -> "_Aggregated":
        t0 = time.perf_counter()
        sent = self._inflight if self._inflight is not None and self._inflight.server_round == t else self._dispatch(t)
        self._inflight = None
        participants, tasks = sent.participants, sent.tasks
        results = self.executor.collect(sent.handle) if sent.handle is not None else []
        total = self.executor.take_sum() if results else None
        canaries = [r for r in results if r.client_id >= len(self.clients)]   # the client-level audit's
        results = [r for r in results if r.client_id < len(self.clients)]
        if results:   # before anything of the round is aggregated or written
            device = ",".join(sorted({r.device for r in results}))
            self._check_release({"client_device": device})
            self._client_device = device
        t1 = time.perf_counter()
        if [r.client_id for r in results] != participants:
            raise RuntimeError(f"round {t}: executor returned clients {[r.client_id for r in results]}, "
                               f"expected {participants}")
        # A client sends ‖Δ‖, which is finite iff Δ is (an overflowing norm is divergence too). For a result
        # without it, a float64 sum of float32 values cannot overflow, so it is finite iff every entry is
        # (one pass, no bool tensor as large as the model).
        bad = [r.client_id for r in results if not math.isfinite(
            float(r.delta.sum(dtype=torch.float64)) if r.delta_norm is None else r.delta_norm)]
        if bad:
            raise TrainingDiverged(f"training diverged in round {t}: non-finite updates from clients {bad} "
                                   f"(clip norm {sent.clip})")
        for r in results:
            self.client_states.put(r.client_id, r.client_state, t)
        results = results + canaries
        # A round without participants (possible with participation=poisson) leaves the global model and
        # the server state as they are, except under privacy.unit=client, where the server's noised
        # release is made whoever took part. What the simulation only logs is never shown to the server.
        shown = [r.server_view(self.cfg.privacy.unit) for r in results]
        if total is not None and not self.cfg.runtime.sum_on_actors:
            if [r.num_samples for r in results[:len(participants)]] != [len(self.clients[c].train_indices)
                                                                       for c in participants]:
                raise RuntimeError(f"round {t}: the clients' training-set sizes are not those the updates were "
                                   f"weighted by")
            agg = self.server.aggregate_folded(t, self.weights, shown, total)
        elif total is not None:
            agg = self.server.aggregate_sum(t, self.weights, shown, total)
        else:
            agg = self.server.aggregate(t, self.weights, shown) if results or self.cfg.privacy.unit == "client" else None
        if agg is not None:
            self.weights = agg.global_weights
            snr = self.server.take_release_snr()   # a diagnostic of the un-noised sum: logged, never shown
            if snr is not None:
                agg.round_logs.setdefault("release_snr", snr)
        t2 = time.perf_counter()
        self.privacy.record_round(tasks, participants)
        if self.executor.overlaps:   # the clients train elsewhere: this process has time for the run's RDP curve
            self.privacy.warm_rdp_curve(participants)
        t3 = time.perf_counter()
        return _Aggregated(sent, results, agg, t0, t1, t2, t3, self.planned_max_sigma())

    def _finish(self, done: "_Aggregated", ev: Evaluation, val: Evaluation | None = None) -> RoundRecord:
        """The round's rows, once it is evaluated."""
        t4 = time.perf_counter()
        sent, results, agg = done.sent, done.results, done.agg
        t, clip, tasks = sent.server_round, sent.clip, sent.tasks
        clip_total = float(np.sqrt(np.sum(np.square(clip)))) if isinstance(clip, tuple) else float(clip)
        slowest = max((r.seconds for r in results), default=0.0)
        timings = {
            "round_seconds": t4 - done.t0, "client_train_seconds": slowest,
            # With overlapping rounds the clients may have trained before this round's clock started.
            "communication_seconds": max(0.0, (done.t1 - done.t0 - sent.plan_seconds) - slowest),
            "aggregation_seconds": done.t2 - done.t1, "accounting_seconds": sent.plan_seconds + (done.t3 - done.t2),
            "eval_seconds": t4 - done.t3}
        round_row = rows.round_row(t, len(sent.participants), ev, val, clip_total, float(self.epsilons.max()),
                                   self.epsilon_scope, results, timings, agg.round_logs if agg is not None else {})
        logs_of = (agg.client_logs if agg is not None else None) or [{}] * len(results)
        client_rows = rows.client_rows(t, results, tasks, logs_of, clip_total, self.epsilons, self.epsilon_scope)
        return RoundRecord(t, round_row, client_rows, max_noise_multiplier=done.max_sigma)

    def _evaluates_on_worker(self, t: int) -> bool:
        """Whether round ``t``'s evaluation runs on a worker (which an overlapping round would keep busy)."""
        return self._eval_due(t) and eval_where(self.cfg) == "actor"

    def _eval_due(self, t: int) -> bool:
        return not (t % self.cfg.eval_every and t != self.cfg.rounds)

    def evaluate(self, t: int) -> Evaluation:
        """Test metrics of the global model after round ``t``: every ``eval_every`` rounds and after the
        last round (NaN in between), on a worker or here (``runtime.eval_on``)."""
        if not self._eval_due(t):
            return Evaluation(math.nan, math.nan, math.nan)
        return self._score(self.data.test.x, self.data.test_y, self.data.test_x)

    def validate(self, t: int) -> Evaluation | None:
        """Validation metrics of the global model after round ``t`` on the public server hold-out, when
        the test metrics are due and the run has a hold-out (``data.server_holdout``); else None."""
        if self.val_x is None or not self._eval_due(t):
            return None
        return self._score(self.val_x, self.val_y, lambda: self.val_x)

    def _score(self, x: Any, y: torch.Tensor, float_x: Callable[[], torch.Tensor]) -> Evaluation:
        """Metrics on (x, y): ``x`` as the workers take it (uint8 images they normalise, or float
        tensors), ``float_x()`` the float tensors this process evaluates when the executor leaves it
        here. ``idle``: no round trains meanwhile (the last round's evaluation)."""
        remote = self.executor.evaluate(self.weights, x, y, self.info.num_classes, idle=self._inflight is None)
        if remote is not None:
            return remote
        vector_to_parameters(self.weights.clone(), self.model.parameters())
        return evaluate(self.model, float_x(), y, self.info.num_classes, self.cfg.eval_batch_size)

    def planned_max_sigma(self) -> float:
        """The largest σ_i planned so far (NaN if none)."""
        return float(self.privacy.max_sigma)
