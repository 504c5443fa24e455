"""Client-side execution shared by every executor: one runner trains any client of a run on demand."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from raysim.algorithms.registry import get_method
from raysim.algorithms.uploads import UploadContext
from raysim.config import UPDATE_CLIPPING, Config, client_mechanism
from raysim.privacy import clipping
from raysim.data import ArrayDataset, to_float_tensor
from raysim.metrics import Evaluation, eval_batches, summarize
from raysim.models import model_for
from raysim.privacy.grad_sample import layer_slices, make_engine
from raysim.allocator import configure_process
from raysim.rng import np_generator
from raysim.training import CorrelatedSteps, LocalStats, example_norm_pass, local_train
from raysim.messages import ClientData, ClientResult, ClientTask, RoundPayload


def to_device(obj: Any, device: torch.device) -> Any:
    """Move tensors (also inside dicts/lists) to ``device``; other values pass through."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def eval_where(cfg: Config) -> str:
    """``runtime.eval_on`` resolved: ``auto`` evaluates on a client actor when clients have GPU shares."""
    if cfg.runtime.eval_on != "auto":
        return cfg.runtime.eval_on
    return "actor" if cfg.runtime.num_gpus_per_client > 0 else "driver"


def client_device(cfg: Config) -> torch.device:
    """CUDA when the actor was given a GPU share and one is visible, else CPU."""
    return torch.device("cuda") if cfg.runtime.num_gpus_per_client > 0 and torch.cuda.is_available() else torch.device("cpu")


class ClientRunner:
    """Trains any client of a run on demand: one per actor (or one in the serial executor).

    It keeps the run's shared train arrays (uint8, as they arrived: on Ray a zero-copy view of the
    one copy in the node's object store), the train split normalised to float32 (:meth:`rows`: each
    row once, the first time a task needs it; 4 bytes a pixel, at most 614 MB for CIFAR-10), and one
    model. A task names its client's shard (:class:`ClientData`, indices into the shared arrays); the
    runner gathers that client's float rows for the task and drops the gathered copy after it, so
    its memory never grows past one float copy of the split, however many clients it trains.
    :meth:`configure` re-targets the runner at another run on the same data (a warm actor reused by
    the next run of a sweep).
    """

    def __init__(self, cfg: Config, clipping: str, train: ArrayDataset) -> None:
        self.train_data = train
        self.info = train.info
        n = train.x.shape[0]
        # Pages of the float images are only touched, so only paid for, when a row is first normalised.
        # Token rows need no normalising: each task converts its own rows (uint8 to int64 ids).
        self._images = (None if self.info.kind == "tokens" else
                        torch.empty((n, *train.x.shape[3:], *train.x.shape[1:3]), memory_format=torch.channels_last))
        self._normalised = torch.zeros(n, dtype=torch.bool)
        self._labels = torch.from_numpy(np.array(train.y, dtype=np.int64))   # a copy: Ray's view is read-only
        self.configure(cfg, clipping)

    def configure(self, cfg: Config, clipping: str) -> None:
        """Set up for the run ``cfg``: model, engine and declared uploads; no state of an earlier run survives."""
        configure_process(cfg.runtime)
        self.cfg = cfg
        self.clipping = clipping
        self.spec = get_method(cfg.method)
        self.device = client_device(cfg)
        self.model = model_for(cfg, self.info, self.spec.model_options(cfg)).to(self.device)
        self.layer_slices = layer_slices(self.model)
        self.engine = make_engine(cfg.privacy.engine)
        self.uploads = self.spec.uploads(cfg)
        #: The privacy audit only (``raysim.audit``): task -> the per-step canaries of that task's training, or None.
        self.canaries: Any = None
        #: The client-level audit only (``raysim.audit_clients``): task -> the update a canary client's local
        #: training yields (a fixed direction), or None for a client that trains on its data.
        self.fixed_updates: Any = None

    def evaluate(self, weights: torch.Tensor, x: Any, y: torch.Tensor, num_classes: int) -> Evaluation:
        """The global model ``weights`` on a test set, on this runner's device (``runtime.eval_on=actor``)."""
        return summarize(*self.eval_batches(weights, x, y), y, num_classes)

    def eval_batches(self, weights: torch.Tensor, x: Any, y: torch.Tensor) -> tuple[list[float], torch.Tensor]:
        """:func:`raysim.metrics.eval_batches` of the global model ``weights`` on (x, y), on this runner's
        device, batches of ``eval_batch_size``: a part of a test set that several actors evaluate.
        ``x``: float tensors, or uint8 images (N, H, W, C) that are normalised here first, channels-last (the
        same bits as the server's normalisation: it is elementwise)."""
        if isinstance(x, np.ndarray):
            x = to_float_tensor(x, self.info, channels_last=True)
        vector_to_parameters(weights.to(self.device), self.model.parameters())
        return eval_batches(self.model, x.to(self.device), y.to(self.device), self.cfg.eval_batch_size)

    def rows(self, indices: torch.Tensor) -> torch.Tensor:
        """The train images at ``indices``, normalised to float32 (N, C, H, W) on the CPU in the
        channels-last memory format (the layout oneDNN's convolutions run natively in and the one the
        ``bk`` engine runs its forward pass in, so no step copies its batch into it). Each row is
        normalised once per runner, the first time a task needs it, and kept: an actor pays for the
        clients it trains, not for the whole split at start-up, and no later task converts it again.
        Token rows come as int64 ids (N, T), converted for each call."""
        if self._images is None:
            return to_float_tensor(self.train_data.x[indices.numpy()], self.info)
        todo = indices[~self._normalised[indices]].unique()
        if len(todo):
            self._images[todo] = to_float_tensor(self.train_data.x[todo.numpy()], self.info, channels_last=True)
            self._normalised[todo] = True
        return self._images[indices]

    def tensors(self, client: ClientData) -> tuple[torch.Tensor, ...]:
        """(x, y, x_val, y_val) of one client, gathered from :meth:`rows` onto the runner's device:
        x channels-last, x_val contiguous; the same values, bit for bit, as converting the client's
        own uint8 rows."""
        train, val = (torch.tensor(np.asarray(i, dtype=np.int64)) for i in (client.train_indices, client.val_indices))
        labels = self._labels
        return to_device((self.rows(train), labels[train], self.rows(val).contiguous(), labels[val]), self.device)

    def train(self, payload: RoundPayload, task: ClientTask, client: ClientData) -> ClientResult:
        """One round of ``client`` (``task.client_id``): local (DP-)training from the payload, then its uploads."""
        start = time.perf_counter()
        if client.client_id != task.client_id:
            raise ValueError(f"task for client {task.client_id} came with the shard of client {client.client_id}")
        fixed = self.fixed_updates(task) if self.fixed_updates is not None else None
        if fixed is None:
            delta, stats, new_state, norms, (y, xv, yv) = self._train_locally(payload, task, client)
        else:   # a canary client: no data, its local training yields the fixed update
            delta, norms, y, xv, yv = fixed.detach().to(torch.float32).cpu(), None, torch.zeros(0), None, None
            stats, new_state = LocalStats(0, math.nan, 0.0), task.client_state
        seed, server_round, cid = self.cfg.train_seed, task.server_round, task.client_id
        client_level = self.clipping == UPDATE_CLIPPING   # local training without DP; the whole update clipped
        frac_clipped, update_norm = stats.frac_clipped, None
        if client_level:
            delta, update_norm = clipping.clip_update(delta, float(task.clip_norm))
            frac_clipped = float(update_norm > float(task.clip_norm))
        new_state = to_device(new_state, torch.device("cpu"))
        ctx = UploadContext(cfg=self.cfg, task=task, model=self.model, delta=delta, num_samples=len(y),
                            num_steps=stats.num_steps, frac_clipped=frac_clipped, val_x=xv, val_y=yv,
                            num_classes=self.info.num_classes, layer_slices=self.layer_slices,
                            example_norms=norms, update_norm=update_norm,
                            rng=lambda purpose: np_generator(seed, purpose, server_round, cid))
        uploads, diagnostics = {}, {}
        for u in self.uploads:
            (diagnostics if u.release.kind == "diagnostic" else uploads)[u.name] = u.compute(ctx)
        delta_norm = float(delta.norm())   # the rows' update norm; finite iff Δ is (an overflow is divergence too)
        return ClientResult(
            client_id=task.client_id, server_round=task.server_round, num_samples=len(y), num_steps=stats.num_steps,
            delta=delta, train_loss=stats.train_loss, frac_clipped=frac_clipped, uploads=uploads,
            diagnostics=diagnostics, client_state=new_state, seconds=time.perf_counter() - start,
            device=self.device.type, delta_norm=delta_norm)

    def _train_locally(self, payload: RoundPayload, task: ClientTask, client: ClientData) -> tuple[Any, ...]:
        """Local (DP-)training of ``client`` from the payload: (Δ on the CPU, its :class:`LocalStats`, the new
        client state, the pre-round example norms or None, (y, x_val, y_val))."""
        x, y, xv, yv = self.tensors(client)
        model = self.model
        task, correlated = self._step_noise(task, len(y))
        # No-ops on CPU (Tensor.to returns the same tensor), copies onto the GPU otherwise.
        payload = dataclasses.replace(payload, start_weights=payload.start_weights.to(self.device),
                                      global_weights=payload.global_weights.to(self.device),
                                      broadcast=to_device(payload.broadcast, self.device))
        task = dataclasses.replace(task, client_state=to_device(task.client_state, self.device))
        # A private copy: the parameters become views of it and are updated in place.
        weights = payload.start_weights.clone()
        vector_to_parameters(weights, model.parameters())
        # The pre-round norm pass (ADPC's histogram, the adaptive-quantile bit): every example's gradient
        # norm at the round's starting model, before training and independent of its sampling and noise.
        norms = (example_norm_pass(model, x, y, engine=self.engine, batch_size=self.cfg.batch_size)
                 if any(u.needs_example_norms for u in self.uploads) else None)
        hooks = self.spec.client(self.cfg, payload, task)
        client_level = self.clipping == UPDATE_CLIPPING   # local training without DP; the whole update clipped
        stats = local_train(model, x, y, hooks, clipping="none" if client_level else self.clipping, engine=self.engine,
                            per_layer=self.spec.per_layer_clipping, seed=self.cfg.train_seed, client_id=task.client_id,
                            canaries=self.canaries(task) if self.canaries is not None else None, correlated=correlated)
        params = list(model.parameters())
        new_state = hooks.finalize(params, stats.num_steps)
        if correlated is not None:   # the client's noise state and step count, kept with its state between rounds
            new_state = {**(new_state or {}), STEP_NOISE: {"stream": correlated.stream.state_dict(),
                                                           "steps": correlated.offset + stats.num_steps}}
        if _tiles(weights, params):   # as vector_to_parameters left them: the end weights are in place
            end = weights
        else:                         # a hook gave a parameter storage of its own
            with torch.no_grad():
                end = parameters_to_vector(params).detach()
        return (end - payload.start_weights).cpu(), stats, new_state, norms, (y, xv, yv)


    def _step_noise(self, task: ClientTask, num_samples: int) -> tuple[ClientTask, CorrelatedSteps | None]:
        """Under a correlated mechanism on the DP-SGD steps (``task.step_strategy``): the task without the
        client's noise state (what the method's hooks see) and the client's :class:`CorrelatedSteps`, its
        stream restored from that state (a fresh one before its first round)."""
        if task.step_strategy is None:
            return task, None
        state = dict(task.client_state or {})
        saved = state.pop(STEP_NOISE, None)
        size = sum(p.numel() for p in self.model.parameters())
        stream = client_mechanism(self.cfg.privacy.mechanism).client_stream(task.step_strategy, size)
        if saved is not None:
            stream.load_state_dict(saved["stream"])
        groups = CorrelatedSteps.partition(num_samples, task.step_groups, self.cfg.train_seed, task.client_id)
        correlated = CorrelatedSteps(groups, task.step_rate, stream, int(saved["steps"]) if saved is not None else 0)
        return dataclasses.replace(task, client_state=state or None), correlated


#: The key of a client's correlated step noise in its persisted state (:meth:`ClientRunner._step_noise`).
STEP_NOISE = "step_noise"


def _tiles(flat: torch.Tensor, params: list[torch.Tensor]) -> bool:
    """Whether ``params`` are, in order, contiguous views of ``flat`` that cover it."""
    offset, base, size = 0, flat.data_ptr(), flat.element_size()
    for p in params:
        if (p.dtype != flat.dtype or p.device != flat.device or not p.is_contiguous()
                or p.data_ptr() != base + offset * size):
            return False
        offset += p.numel()
    return offset == flat.numel()
