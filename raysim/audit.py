"""``raysim audit``: an empirical lower bound on ε from one training run, with white-box canaries
(Steinke, Nasr & Jagielski 2023), record level.

**DP-SGD** (:func:`run_audit`). The configured run executes as it is, every client, the method's own
server and client hooks, C^(t) as the method sets it, its side channels, in this process. One client
(client 0) trains with M canaries besides its examples: each canary is included with probability 1/2,
and an included canary joins each of that client's Poisson batches with the same probability q as a
real example. A canary is an example as the book-keeping engine records it, one (input activation,
output gradient) pair at one parametrised layer (:class:`~raysim.privacy.grad_sample.LayerCanaries`):
the engine appends its rows to the batch's recorded pairs, so its per-example norm, its clip factor and
its share of the clipped sum come from the same ``LayerStats.sq_norm``, ``clip_factors`` and
``LayerStats.clipped_sums`` code as every real example's. The pairs are built so that each canary's
gradient has two coordinates of one layer (one for a GroupNorm), disjoint from every other canary's,
and its norm is ``canary_norm`` times the round's C (times C_k, the layer's threshold, under per-layer
clipping). The canaries are stratified by layer: every parametrised layer holds its share of them, as
many as it has disjoint coordinate pairs for, so that a bug confined to one layer, however small, moves
that layer's canaries. With ``privacy.clipping=batch`` (no per-example path) and with the ``vmap``
engine (no recorded pairs) the same canary gradients join the batch as
:class:`~raysim.privacy.grad_sample.SparseExamples` instead: before the mean is clipped, or through
the engine's extra examples.

Each canary is scored by the inner product of its gradient's direction with that client's total
update over the rounds, −Σ_t Δw^(t); the top and bottom ``guess_fraction`` of the scores are guessed
in and out, and the number of right guesses becomes a 95 %-confidence lower bound ε_lb
(:mod:`raysim.privacy.audit_bound`), overall and per layer (each layer's canaries scored among
themselves). Over all canaries, the same scores also give Steinke et al.'s and Mahloujifar et al.'s
f-DP bound with the threshold chosen on the scores (one-sided guesses, Bonferroni over the thresholds,
:func:`~raysim.privacy.audit_bound.score_audit`), each with its ceiling. ε_lb is reported beside the ε accounted for what the audit observes, that client's
DP-SGD releases (every release of every step at the σ its tasks carried), and beside the ceiling,
the ε_lb of all guesses right.

**Gaussian side channels** (:func:`audit_side_channels`). A side channel computed from per-example
gradient norms (ADPC's histogram, the adaptive-quantile count) is audited through the upload's own
client function: M independent releases (each from its own keyed stream) of client 0's statistic at
the initial model, each with one canary example (its norm the median of the client's) included with
probability 1/2, scored by the release's inner product with the canary's effect (or, when the median
does not move the statistic, a norm of C/2). ε_lb is compared with
the ε of one release. A side channel that is not a function of the norms says in one line why it is
not audited.

What it shows and what it does not: docs/privacy.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.uploads import UploadContext, gaussian_uploads
from raysim.client import ClientRunner
from raysim.config import Config, ConfigError, client_mechanism
from raysim.data import to_float_tensor
from raysim.experiment import prepare
from raysim.messages import ClientTask
from raysim.models import init_parameters, model_for
from raysim.privacy.accounting import StepEvent, compute_epsilon
from raysim.privacy.audit_bound import epsilon_lower_bound, score_audit, score_audit_ceiling
from raysim.privacy.grad_sample import LayerCanaries, SparseExamples, make_engine, parametrised_layers
from raysim.privacy.plan import accounting_factor
from raysim.rng import np_generator, torch_generator
from raysim.run_data import make_partition
from raysim.run_plan import RunPlan, plan_run
from raysim.training import example_norm_pass, sample_rate, steps_per_epoch

__all__ = ["AuditError", "AuditResult", "LayerAudit", "SideChannelAudit", "RecordAudit", "audit_ceiling",
           "run_audit", "audit_side_channels", "record_level_audit"]


class AuditError(ConfigError):
    """The audit cannot give a bound for this configuration (one line, exit code 2)."""


@dataclass(frozen=True)
class LayerAudit:
    """The canaries of one parametrised layer, scored among themselves."""

    layer: str
    parameters: int
    canaries: int
    guesses: int
    correct: int
    epsilon_lower_bound: float
    epsilon_ceiling: float


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float     # 95 % confidence, all canaries
    epsilon_ceiling: float         # the largest ε_lb this audit can reach: every guess right
    epsilon_accounted: float       # the audited client's DP-SGD releases, as accounted
    delta: float
    clipping: str
    noise_multiplier: float        # σ of the audited client's first round
    canaries: int
    guesses: int
    correct: int
    steps: int
    canary_norm: float             # pre-clipping norm of each canary, in units of C
    method: str = ""
    path: str = ""                 # how canaries enter: layer_pairs | sparse_extra | batch_mean
    per_layer: tuple[LayerAudit, ...] = ()   # each layer's bound at 1 − 0.05/K: 95 % for all K together
    #: all canaries with the threshold chosen on the scores (one-sided guesses, Bonferroni over the thresholds):
    #: Steinke et al.'s and the f-DP bound (95 % each), and their ceilings at this canary count
    threshold_steinke: float = 0.0
    threshold_fdp: float = 0.0
    threshold_ceiling_steinke: float = 0.0
    threshold_ceiling_fdp: float = 0.0

    @property
    def refutes(self) -> bool:
        """Whether the overall bounds or a layer's exceed the accounted ε (each a 95 % statement)."""
        found = [self.epsilon_lower_bound, self.threshold_steinke, self.threshold_fdp]
        return max(found + [p.epsilon_lower_bound for p in self.per_layer]) > self.epsilon_accounted

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["refutes"] = self.refutes
        out["per_layer"] = [asdict(p) for p in self.per_layer]
        return out


@dataclass(frozen=True)
class SideChannelAudit:
    name: str
    audited: bool
    reason: str = ""               # not audited: why, in one line
    noise_multiplier: float = 0.0
    epsilon_accounted: float = 0.0   # one release
    releases: int = 0
    guesses: int = 0
    correct: int = 0
    epsilon_lower_bound: float = 0.0
    epsilon_ceiling: float = 0.0


@dataclass(frozen=True)
class RecordAudit:
    """Everything ``raysim audit`` reports at record level."""

    dp_sgd: AuditResult
    side_channels: tuple[SideChannelAudit, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {**self.dp_sgd.as_dict(), "side_channels": [asdict(s) for s in self.side_channels]}


def audit_ceiling(canaries: int, guesses: int, delta: float) -> float:
    """The largest ε_lb an audit with ``canaries`` canaries and ``guesses`` guesses can report (all right):
    no claim above it can be refuted by that audit."""
    return epsilon_lower_bound(canaries, guesses, guesses, delta)


def _check_options(canaries: int, guess_fraction: float) -> None:
    if canaries < 10:
        raise ConfigError(f"--canaries must be >= 10, got {canaries}")
    if not 0 < guess_fraction <= 0.5:
        raise ConfigError(f"--guess-fraction must be in (0, 0.5], got {guess_fraction}")


def _guess(scores: np.ndarray, included: np.ndarray, guess_fraction: float, delta: float,
           confidence: float = 0.95) -> tuple[int, int, float, float]:
    """(guesses, correct, ε_lb, ceiling) of guessing the top and bottom ``guess_fraction`` of ``scores``."""
    m = len(scores)
    k = max(1, int(guess_fraction * m))
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
    return (2 * k, correct, epsilon_lower_bound(m, 2 * k, correct, delta, confidence),
            epsilon_lower_bound(m, 2 * k, 2 * k, delta, confidence))


# --------------------------------------------------------------------------- canary design

@dataclass
class _LayerDesign:
    """The canaries of one layer at unit scale: their recorded pairs and their (reference) gradients."""

    name: str
    parameters: int
    a_shape: tuple[int, ...]
    g_shape: tuple[int, ...]
    a_index: np.ndarray            # (m, 2) flat positions in the per-example input (value 1 each, -1: none)
    g_index: np.ndarray            # (m, 2) flat positions in the per-example output gradient
    g_value: np.ndarray            # (m, 2) their values at unit scale
    coords: np.ndarray             # (m, 2) flat coordinates of the canary's gradient in the model vector
    values: np.ndarray             # (m, 2) the gradient's values there (a pad entry repeats the first with 0)
    norm: np.ndarray               # (m,) the gradient's norm at unit scale

    def __len__(self) -> int:
        return len(self.norm)


def _layer_shapes(model: nn.Module, layers: list[nn.Module], x: torch.Tensor) -> list[tuple[tuple, tuple]]:
    """Per-example (input, output) shapes of each parametrised layer on one example."""
    shapes: dict[int, tuple[tuple, tuple]] = {}

    def hook(module, inputs, output):
        shapes.setdefault(id(module), (tuple(inputs[0].shape[1:]), tuple(output.shape[1:])))

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad():
            model(x[:1])
    finally:
        for h in handles:
            h.remove()
    return [shapes[id(m)] for m in layers]


def _pairs_within(groups: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """All disjoint pairs of positions within each of ``groups`` groups of ``size``: (groups·⌊size/2⌋, 3)
    rows (group, first, second), each group's positions paired in a random order."""
    half = size // 2
    if half == 0:
        return np.zeros((0, 3), dtype=np.int64)
    perm = np.argsort(rng.random((groups, size)), axis=1)[:, : 2 * half].reshape(groups, half, 2)
    group = np.broadcast_to(np.arange(groups)[:, None, None], (groups, half, 1))
    return np.concatenate([group, perm], axis=2).reshape(-1, 3)


def _conv_positions(u: int, size: int, out: int, stride: int, pad: int, dil: int) -> np.ndarray:
    """Input positions p (one dimension) from which kernel offset u reaches a valid output position."""
    p = np.arange(size)
    h = p + pad - u * dil
    return p[(h >= 0) & (h % stride == 0) & (h // stride < out)]


def _design_layer(layer: nn.Module, params: dict[str, int], a_shape: tuple, g_shape: tuple, wanted: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """At most ``wanted`` canaries of ``layer`` at unit scale, as (a_index, g_index, g_value, coords, values):
    their recorded pair (a one- or two-hot input, a one- or two-hot output gradient) and the gradient that
    pair gives, worked out by hand (flat coordinates in the model vector; ``params``: each parameter
    name's offset there). A pad entry repeats the first coordinate with value 0."""
    empty = (np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64), np.zeros((0, 2)), np.zeros((0, 2), np.int64),
             np.zeros((0, 2)))
    if isinstance(layer, nn.Linear) and len(a_shape) in (1, 2) and layer.weight.requires_grad:
        # a = e_i, g = e_o: weight (o, i) = 1 (the canary's own coordinate) and bias o = 1 (shared). On a
        # sequence (T, D) (an LSTM's input projection), both at one position t drawn per canary.
        d_in, d_out = a_shape[-1], g_shape[-1]
        pick = rng.choice(d_in * d_out, size=min(wanted, d_in * d_out), replace=False)
        o, i = pick // d_in, pick % d_in
        none = np.full(len(pick), -1)
        if len(a_shape) == 2:
            t = rng.integers(0, a_shape[0], len(pick))
            i_at, o_at = t * d_in + i, t * d_out + o
        else:
            i_at, o_at = i, o
        w = params["weight"] + o * d_in + i
        has_bias = "bias" in params
        coords = np.stack([w, params["bias"] + o if has_bias else w], axis=1)
        values = np.stack([np.ones(len(pick)), np.ones(len(pick)) if has_bias else np.zeros(len(pick))], axis=1)
        return (np.stack([i_at, none], axis=1), np.stack([o_at, none], axis=1), np.tile([1.0, 0.0], (len(pick), 1)),
                coords, values)
    if (isinstance(layer, nn.Conv2d) and isinstance(layer.padding, tuple) and layer.padding_mode == "zeros"
            and layer.weight.requires_grad):
        c_in, h_in, w_in = a_shape
        c_out, h_out, w_out = g_shape
        kh, kw = layer.kernel_size
        (sy, sx), (py, px), (dy, dx) = layer.stride, layer.padding, layer.dilation
        if kh * kw >= 2:
            # Two kernel offsets u1, u2 of one (o, c), reached from one input pixel p: a = e_(c,p),
            # g = e_(o,h1) − e_(o,h2) with h = p + pad − u·dilation (stride 1 positions): weight
            # (o, c, u1) = +1, (o, c, u2) = −1, the bias Σ g = 0.
            pairs = _pairs_within(c_out * c_in, kh * kw, rng)
        else:
            # A 1x1 kernel: two input channels c1, c2 at two pixels p1 ≠ p2 (a = e_(c1,p1) + e_(c2,p2)),
            # g = e_(o,p1) − e_(o,p2): weight (o, c1) = +1, (o, c2) = −1, the bias 0.
            pairs = _pairs_within(c_out, c_in, rng)
        pairs = pairs[rng.permutation(len(pairs))]
        rows = []
        ys_of = {u: _conv_positions(u, h_in, h_out, sy, py, dy) for u in range(kh)}
        xs_of = {u: _conv_positions(u, w_in, w_out, sx, px, dx) for u in range(kw)}
        for group, w1, w2 in pairs:
            if len(rows) >= wanted:
                break
            if kh * kw >= 2:
                o, c = divmod(int(group), c_in)
                (uy1, ux1), (uy2, ux2) = divmod(int(w1), kw), divmod(int(w2), kw)
                ys = np.intersect1d(ys_of[uy1], ys_of[uy2], assume_unique=True)
                xs = np.intersect1d(xs_of[ux1], xs_of[ux2], assume_unique=True)
                if not len(ys) or not len(xs):
                    continue
                p = (int(rng.choice(ys)), int(rng.choice(xs)))
                h1 = ((p[0] + py - uy1 * dy) // sy, (p[1] + px - ux1 * dx) // sx)
                h2 = ((p[0] + py - uy2 * dy) // sy, (p[1] + px - ux2 * dx) // sx)
                a1, a2 = (c * h_in + p[0]) * w_in + p[1], -1
                k1, k2 = (o * c_in + c) * kh * kw + int(w1), (o * c_in + c) * kh * kw + int(w2)
            else:
                o, c1, c2 = int(group), int(w1), int(w2)
                ys, xs = ys_of[0], xs_of[0]
                if len(ys) * len(xs) < 2:
                    continue
                cells = rng.choice(len(ys) * len(xs), size=2, replace=False)
                p1 = (int(ys[cells[0] // len(xs)]), int(xs[cells[0] % len(xs)]))
                p2 = (int(ys[cells[1] // len(xs)]), int(xs[cells[1] % len(xs)]))
                h1 = ((p1[0] + py) // sy, (p1[1] + px) // sx)
                h2 = ((p2[0] + py) // sy, (p2[1] + px) // sx)
                a1, a2 = (c1 * h_in + p1[0]) * w_in + p1[1], (c2 * h_in + p2[0]) * w_in + p2[1]
                k1, k2 = o * c_in + c1, o * c_in + c2
            rows.append((a1, a2, (o * h_out + h1[0]) * w_out + h1[1], (o * h_out + h2[0]) * w_out + h2[1], k1, k2))
        if not rows:
            return empty
        r = np.array(rows, dtype=np.int64)
        m = len(r)
        return (r[:, :2], r[:, 2:4], np.tile([1.0, -1.0], (m, 1)), params["weight"] + r[:, 4:6],
                np.tile([1.0, -1.0], (m, 1)))
    if isinstance(layer, nn.GroupNorm) and layer.weight is not None and layer.weight.requires_grad:
        channels = a_shape[0]
        spatial = int(np.prod(a_shape)) // channels
        if spatial < 2:
            return empty
        # a = e_(c,s0), g = e_(c,s0) − e_(c,s1): dβ_c = 0, dγ_c = x̂_s0 − x̂_s1 (x̂: a normalised by its group).
        chosen = rng.permutation(channels)[:wanted]
        s0 = rng.integers(0, spatial, len(chosen))
        s1 = (s0 + 1 + rng.integers(0, spatial - 1, len(chosen))) % spatial
        m = len(chosen)
        a_index = np.stack([chosen * spatial + s0, np.full(m, -1)], axis=1)
        g_index = np.stack([chosen * spatial + s0, chosen * spatial + s1], axis=1)
        a = _dense(a_index, np.ones((m, 2)), a_shape, torch.float64)
        x_hat = F.group_norm(a, layer.num_groups, eps=layer.eps).reshape(m, channels, spatial)
        rows = torch.arange(m)
        gamma = (x_hat[rows, torch.from_numpy(chosen), torch.from_numpy(s0)]
                 - x_hat[rows, torch.from_numpy(chosen), torch.from_numpy(s1)]).numpy()
        coords = np.stack([params["weight"] + chosen, params["weight"] + chosen], axis=1)
        return a_index, g_index, np.tile([1.0, -1.0], (m, 1)), coords, np.stack([gamma, np.zeros(m)], axis=1)
    return empty


def _dense(index: np.ndarray, value: np.ndarray, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """(m, *shape) rows with ``value[j, s]`` at flat position ``index[j, s]`` (−1: no entry)."""
    m, size = index.shape[0], int(np.prod(shape))
    out = torch.zeros(m, size, dtype=dtype)
    rows = np.repeat(np.arange(m), index.shape[1])
    flat, vals = index.reshape(-1), value.reshape(-1)
    keep = flat >= 0
    out.index_put_((torch.from_numpy(rows[keep]), torch.from_numpy(flat[keep])),
                   torch.from_numpy(vals[keep]).to(dtype), accumulate=True)
    return out.view(m, *shape)


def _reference_grads(layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of ⟨g_j, layer(a_j)⟩ with respect to the layer's parameters, by autograd on
    the layer's own forward function, one example at a time (independent of the engine)."""
    from torch.func import functional_call, grad, vmap
    params = {n: p.detach() for n, p in layer.named_parameters(recurse=False) if p.requires_grad}

    def inner(ps, aj, gj):
        return (functional_call(layer, ps, (aj.unsqueeze(0),))[0] * gj).sum()

    return vmap(grad(inner), in_dims=(None, 0, 0))(params, a, g)


def _check_design(layer: nn.Module, d: "_LayerDesign", offset: dict[str, int], dtype: torch.dtype,
                  rng: np.random.Generator, sample: int = 8) -> None:
    """The hand-worked gradients of a sample of the layer's canaries against autograd (an audit self-check)."""
    if not len(d):
        return
    pick = rng.choice(len(d), size=min(sample, len(d)), replace=False)
    a = _dense(d.a_index[pick], np.ones((len(pick), 2)), d.a_shape, dtype)
    g = _dense(d.g_index[pick], d.g_value[pick], d.g_shape, dtype)
    ref = _reference_grads(layer, a, g)
    for j, c in enumerate(pick):
        want: dict[int, float] = {}
        for coord, value in zip(d.coords[c], d.values[c]):
            want[int(coord)] = want.get(int(coord), 0.0) + float(value)
        got = {}
        for name, grads in ref.items():
            flat = grads[j].reshape(-1)
            for i in torch.nonzero(flat).flatten().tolist():
                got[offset[name] + i] = float(flat[i])
        want = {k: v for k, v in want.items() if v != 0.0}
        if set(got) != set(want) or any(abs(got[k] - want[k]) > 1e-4 * max(1.0, abs(want[k])) for k in want):
            raise AuditError(f"audit self-check: canary {c} of layer {d.name!r} has gradient {got}, expected {want}")


def _design(cfg: Config, model: nn.Module, x: torch.Tensor, canaries: int) -> list[_LayerDesign]:
    """The canaries of every parametrised layer: ``canaries`` in all, split evenly over the layers and
    capped by each layer's disjoint coordinates (the rest goes to the layers with room)."""
    layers = parametrised_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    shapes = _layer_shapes(model, layers, x)
    rng = np_generator(cfg.train_seed, "audit-canaries")
    offsets, start = {}, 0
    for p in model.parameters():
        offsets[id(p)] = start
        start += p.numel()
    layer_params = [{n: offsets[id(p)] for n, p in layer.named_parameters(recurse=False)} for layer in layers]
    candidates = [_design_layer(layer, lp, a_s, g_s, canaries, rng)
                  for layer, lp, (a_s, g_s) in zip(layers, layer_params, shapes)]
    capacity = [len(c[0]) for c in candidates]
    share = [0] * len(layers)
    left, open_layers = min(canaries, sum(capacity)), [k for k in range(len(layers)) if capacity[k]]
    while left > 0 and open_layers:                   # water-filling: even shares, capped by capacity
        each = max(1, left // len(open_layers))
        for k in list(open_layers):
            take = min(each, capacity[k] - share[k], left)
            share[k] += take
            left -= take
            if share[k] == capacity[k]:
                open_layers.remove(k)
            if left == 0:
                break
    designs = []
    dtype = next(model.parameters()).dtype
    check_rng = np_generator(cfg.train_seed, "audit-self-check")
    for k, (layer, (a_s, g_s)) in enumerate(zip(layers, shapes)):
        a_index, g_index, g_value, coords, values = (c[: share[k]] for c in candidates[k])
        norm = np.sqrt((values ** 2).sum(axis=1))
        d = _LayerDesign(names.get(id(layer), "?") or "<root>", sum(p.numel() for p in layer.parameters(recurse=False)),
                         a_s, g_s, a_index, g_index, g_value, coords, values, norm)
        _check_design(layer, d, layer_params[k], dtype, check_rng)
        designs.append(d)
    if sum(len(d) for d in designs) < 10:
        raise AuditError(f"the model leaves room for {sum(len(d) for d in designs)} disjoint canaries; the audit needs 10")
    return designs


# --------------------------------------------------------------------------- the audited run

class _AuditExecutor:
    """The serial executor with canaries in one client's training; keeps that client's updates and tasks."""

    overlaps = False

    def __init__(self, client_id: int, canaries_for) -> None:
        self.client_id = client_id
        self.canaries_for = canaries_for
        self.runner: ClientRunner | None = None
        self.deltas: list[torch.Tensor] = []
        self.tasks: list[ClientTask] = []

    def start(self, plan: RunPlan, train: Any) -> None:
        self.runner = ClientRunner(plan.cfg, plan.clipping, train)
        self.runner.canaries = lambda task: self.canaries_for(task) if task.client_id == self.client_id else None

    def ready(self) -> None:
        return None

    def submit(self, payload, tasks, clients, fold=None):
        return payload, tasks, clients

    def take_sum(self):
        return None

    def collect(self, handle):
        payload, tasks, clients = handle
        results = sorted((self.runner.train(payload, t, c) for t, c in zip(tasks, clients)), key=lambda r: r.client_id)
        for t, r in zip(sorted(tasks, key=lambda t: t.client_id), results):
            if r.client_id == self.client_id:
                self.deltas.append(r.delta.detach().double())
                self.tasks.append(t)
        return results

    def evaluate(self, weights, x, y, num_classes, idle=False):
        return None

    def shutdown(self) -> None:
        self.runner = None


def _layer_thresholds(clip: float | Sequence[float], k: int) -> float:
    return float(clip[k]) if isinstance(clip, (tuple, list)) else float(clip)


def run_audit(plan: RunPlan | Config, canaries: int = 10000, guess_fraction: float = 0.1, client_id: int = 0,
              canary_norm: float = 10.0) -> AuditResult:
    """Audit the DP-SGD releases of client ``client_id`` in the run ``plan`` (a config is planned first; see
    the module docstring)."""
    from raysim.simulation import Simulation, TrainingDiverged

    _check_options(canaries, guess_fraction)
    plan = plan_run(plan)
    spec, clipping = plan.spec, plan.clipping
    if clipping == "none":
        raise ConfigError("nothing to audit: privacy.clipping=none makes no DP claim")
    if client_mechanism(plan.cfg.privacy.mechanism).correlated:
        raise ConfigError(f"the record-level audit scores each step's independent Gaussian noise; "
                          f"privacy.mechanism={plan.cfg.privacy.mechanism} correlates it across steps and is not audited")
    # In this process, no checkpoints, each client's update kept, and the test set scored once at the end
    # (nothing trains on it). Neither changes what the run releases or its privacy; the audit writes no rows.
    cfg = plan.cfg.replace(runtime=dataclasses.replace(plan.cfg.runtime, executor="serial", checkpoint_every=0,
                                                       sum_on_actors=False),
                           eval_every=plan.cfg.rounds)
    plan = dataclasses.replace(plan, cfg=cfg)
    train, test = prepare(plan)
    client = make_partition(cfg, train)[client_id]
    x0 = to_float_tensor(train.x[client.train_indices[:1]], train.info)
    n = len(client.train_indices)
    q, steps = sample_rate(n, cfg.batch_size), steps_per_epoch(n, cfg.batch_size) * cfg.local_epochs

    model = model_for(cfg, train.info, spec.model_options(cfg))
    init_parameters(model, torch_generator(cfg.train_seed, "model-init"))
    designs = _design(cfg, model, x0, canaries)
    layer_of = np.concatenate([np.full(len(d), k) for k, d in enumerate(designs)])
    total = len(layer_of)
    starts = np.cumsum([0] + [len(d) for d in designs])
    included = np_generator(cfg.train_seed, "audit-membership").random(total) < 0.5
    members = np.flatnonzero(included)
    dtype = next(model.parameters()).dtype
    sizes = torch.tensor([p.numel() for p in model.parameters()])
    ends = torch.cumsum(sizes, 0)
    coords = torch.from_numpy(np.concatenate([d.coords for d in designs]))
    owner = torch.bucketize(coords, ends, right=True)
    inside = coords - (ends - sizes)[owner]
    unit_values = torch.from_numpy(np.concatenate([d.values for d in designs]))
    unit_norm = np.concatenate([d.norm for d in designs])
    layer_pairs = clipping == "per_sample" and cfg.privacy.engine == "bk"
    path = "layer_pairs" if layer_pairs else ("sparse_extra" if clipping == "per_sample" else "batch_mean")

    def canaries_for(task: ClientTask):
        sampler = np_generator(cfg.train_seed, "audit-canary-batches", task.server_round, client_id)
        chosen = [members[sampler.random(len(members)) < q] for _ in range(steps)]
        # each canary's scale: canary_norm · C (its layer's C_k under per-layer clipping) over its unit norm
        scale = np.array([canary_norm * _layer_thresholds(task.clip_norm, k) for k in range(len(designs))])
        scale = torch.from_numpy(scale[layer_of] / unit_norm)

        def at_step(step: int):
            picked = chosen[step]
            if layer_pairs:
                ins, outs = [], []
                for k in range(len(designs)):
                    mine = picked[(picked >= starts[k]) & (picked < starts[k + 1])] - starts[k]
                    d = designs[k]
                    ins.append(_dense(d.a_index[mine], np.ones((len(mine), 2)), d.a_shape, dtype))
                    outs.append(_dense(d.g_index[mine], d.g_value[mine] * scale[mine + starts[k]].numpy()[:, None],
                                       d.g_shape, dtype))
                return LayerCanaries(torch.from_numpy(layer_of[picked]), tuple(ins), tuple(outs))
            idx = torch.from_numpy(picked)
            return SparseExamples(owner[idx], inside[idx], (unit_values[idx] * scale[idx].view(-1, 1)).to(dtype))
        return at_step

    executor = _AuditExecutor(client_id, canaries_for)
    sim = Simulation(plan, train, test, executor)
    try:
        for _ in sim.run():
            pass
    except TrainingDiverged as err:
        raise AuditError(f"the audited training diverged ({err}), so no canary can be scored; "
                         f"audit at a smaller lr") from None
    if not executor.deltas:
        raise AuditError(f"client {client_id} trained in no round: nothing to audit")
    moved = -torch.stack(executor.deltas).sum(dim=0)
    if not bool(torch.isfinite(moved).all()):
        raise AuditError("the audited training diverged (non-finite parameters), so no canary can be scored; "
                         "audit at a smaller lr")
    # Each canary is scored on its own coordinates only (a Linear canary's bias entry is shared).
    flat, nonzero = coords.numpy().ravel(), unit_values.numpy().ravel() != 0
    counts = np.bincount(flat[nonzero], minlength=int(sizes.sum()))
    own = torch.from_numpy((counts[coords.numpy()] == 1) & (unit_values.numpy() != 0))
    unit = (unit_values / torch.from_numpy(unit_norm).view(-1, 1)).double() * own
    scores = (moved[coords] * unit).sum(dim=1).numpy()

    factor = accounting_factor(clipping, spec.client.releases_for(cfg))
    events = [StepEvent(q, t.noise_multiplier * factor, steps) for t in executor.tasks]
    accounted = compute_epsilon(events, cfg.privacy.delta, cfg.privacy.accountant)
    delta = cfg.privacy.delta
    guesses, correct, bound, ceiling = _guess(scores, included, guess_fraction, delta)
    per_layer = []
    scored = [k for k in range(len(designs)) if len(designs[k]) >= 10]
    layer_confidence = 1.0 - 0.05 / max(1, len(scored))   # Bonferroni: 95 % for all the layers' bounds together
    for k, d in enumerate(designs):
        sl = slice(starts[k], starts[k + 1])
        if k not in scored:
            per_layer.append(LayerAudit(d.name, d.parameters, len(d), 0, 0, 0.0, 0.0))
            continue
        g_k, c_k, b_k, top_k = _guess(scores[sl], included[sl], guess_fraction, delta, layer_confidence)
        per_layer.append(LayerAudit(d.name, d.parameters, len(d), g_k, c_k, b_k, top_k))
    chosen, top = score_audit(scores[included], scores[~included], delta), score_audit_ceiling(total, delta)
    return AuditResult(bound, ceiling, float(accounted), delta, clipping, float(executor.tasks[0].noise_multiplier),
                       total, guesses, correct, steps * len(executor.tasks), canary_norm, cfg.method, path,
                       tuple(per_layer), chosen.epsilon_steinke, chosen.epsilon_fdp, top.epsilon_steinke,
                       top.epsilon_fdp)


# --------------------------------------------------------------------------- side channels

#: Why a Gaussian upload that is not a function of the per-example gradient norms is not audited.
NOT_AUDITED = {
    "val_f1": ("CRA's noised local F1 is clamped to [0, 1] after its noise, and one validation example moves a "
               "macro-F1 by about 1/|val|: no canary can carry the full sensitivity its bound assumes"),
}


def audit_side_channels(plan: RunPlan | Config, releases: int = 10000, guess_fraction: float = 0.1,
                        client_id: int = 0) -> tuple[SideChannelAudit, ...]:
    """Audit each Gaussian upload of the run ``plan``'s method through its own client function (module
    docstring); a config is planned first."""
    _check_options(releases, guess_fraction)
    plan = plan_run(plan)
    cfg, spec, clipping = plan.cfg, plan.spec, plan.clipping
    uploads = gaussian_uploads(spec.uploads(cfg)) if clipping != "none" else []
    if not uploads:
        return ()
    out = []
    norms = None
    for u in uploads:
        if not u.needs_example_norms:
            out.append(SideChannelAudit(u.name, False, NOT_AUDITED.get(u.name, "its release is not a function of "
                                                                          "the per-example gradient norms")))
            continue
        if norms is None:
            train, _ = prepare(plan)
            client = make_partition(cfg, train)[client_id]
            x = to_float_tensor(train.x[client.train_indices], train.info)
            y = torch.from_numpy(train.y[client.train_indices].astype(np.int64))
            model = model_for(cfg, train.info, spec.model_options(cfg))
            init_parameters(model, torch_generator(cfg.train_seed, "model-init"))
            norms = example_norm_pass(model, x, y, engine=make_engine(cfg.privacy.engine), batch_size=cfg.batch_size)
        task = ClientTask(client_id, 1, float(cfg.privacy.clip_norm), 0.0)

        def release(r: int, example_norms: np.ndarray) -> np.ndarray:
            ctx = UploadContext(cfg=cfg, task=task, model=None, delta=None, num_samples=len(example_norms),
                                num_steps=0, frac_clipped=0.0, val_x=None, val_y=None, num_classes=0, layer_slices=(),
                                example_norms=example_norms,
                                rng=lambda purpose, r=r: np_generator(cfg.train_seed, purpose, r, client_id))
            return np.atleast_1d(np.asarray(u.compute(ctx), dtype=np.float64))

        # The canary example's norm: the client's median, or one below C, whichever the statistic sees; its
        # effect is exact, both releases being drawn with the same noise.
        for canary in (float(np.median(norms)), 0.5 * float(cfg.privacy.clip_norm)):
            with_canary = np.append(norms, canary)
            effect = release(1, with_canary) - release(1, norms)
            if np.any(effect != 0):
                break
        else:
            out.append(SideChannelAudit(u.name, False, "no canary example changes its release"))
            continue
        included = np_generator(cfg.train_seed, "audit-side-membership").random(releases) < 0.5
        scores = np.array([release(r + 1, with_canary if included[r] else norms) @ effect for r in range(releases)])
        guesses, correct, bound, ceiling = _guess(scores, included, guess_fraction, cfg.privacy.delta)
        sigma = u.release.noise_multiplier
        accounted = compute_epsilon([StepEvent(1.0, sigma, u.release.per_round)], cfg.privacy.delta,
                                    cfg.privacy.accountant)
        out.append(SideChannelAudit(u.name, True, "", sigma, float(accounted), releases, guesses, correct, bound, ceiling))
    return tuple(out)


def record_level_audit(plan: RunPlan | Config, canaries: int = 10000, guess_fraction: float = 0.1) -> RecordAudit:
    """The record-level audit ``raysim audit`` prints: DP-SGD, then the Gaussian side channels."""
    plan = plan_run(plan)
    return RecordAudit(run_audit(plan, canaries, guess_fraction), audit_side_channels(plan, canaries, guess_fraction))
