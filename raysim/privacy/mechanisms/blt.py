"""Buffered Linear Toeplitz (BLT) strategies: parameters, closed forms, optimisation and streaming noise.

A BLT (Dvijotham et al. 2024; McMahan et al. 2024) is the lower-triangular Toeplitz strategy ``C`` whose
coefficients are ``1, Σ_i ω_i, Σ_i ω_i θ_i, Σ_i ω_i θ_i², …``: ``output_scale`` ω and ``buf_decay`` θ, one
pair per buffer. Its inverse ``C⁻¹`` (the noising matrix) is again a BLT with as many buffers, so the
correlated noise ``(C⁻¹ z)_t`` of step t streams with one model-sized buffer per θ:

    w_t = z_t − Σ_i ω_i b_i,    then    b_i ← θ_i b_i + w_t        (b_i = 0 before step 0)

BLTs are optimised here for the largest error over the ``n`` released prefix sums times the squared
sensitivity (the *max loss*), either for one participation, with the closed forms of Dvijotham et al.
(2024, Lemmas 5.3 and 5.4; optimisation time independent of n), or for participations at least ``min_sep``
steps apart, on the materialised coefficients (McMahan et al. 2024). The parameters are the two sets of
decays (θ of C, θ̂ of C⁻¹), from which both output scales follow in closed form; L-BFGS minimises the loss
with small log-barrier terms that keep the BLT in the well-behaved class (θ, θ̂ in (0, 1), ω > 0, ω̂ < 0,
Σ ω < 1, Σ ω/θ < 1, distinct decays), as jax_privacy's optimiser does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy.optimize import minimize

from raysim.privacy.mechanisms.toeplitz import max_participations, minsep_sensitivity_squared

__all__ = ["BLT", "optimize_blt", "blt_max_loss", "blt_sensitivity_squared", "blt_max_error", "BLTNoise",
           "BLTStrategy", "blt_for", "strategy_sensitivity"]

_PENALTY = 1e-8            # weight of the barrier terms against the normalised loss
_MIN_GAP = 1e-12           # smallest gap between two decays of one BLT


@dataclass(frozen=True)
class BLT:
    """A BLT strategy ``C``: ``buf_decay`` θ (decreasing) and ``output_scale`` ω, float64 arrays of one length
    (the number of buffers; zero buffers is the identity)."""

    buf_decay: np.ndarray
    output_scale: np.ndarray

    @classmethod
    def build(cls, buf_decay, output_scale) -> "BLT":
        theta = np.atleast_1d(np.asarray(buf_decay, dtype=np.float64))
        omega = np.atleast_1d(np.asarray(output_scale, dtype=np.float64))
        if theta.shape != omega.shape or theta.ndim != 1:
            raise ValueError(f"buf_decay and output_scale must be vectors of one length, got {theta.shape} and {omega.shape}")
        order = np.argsort(-theta, kind="stable")
        return cls(theta[order], omega[order])

    @property
    def buffers(self) -> int:
        return int(self.buf_decay.size)

    def coefs(self, n: int) -> np.ndarray:
        """The first ``n`` Toeplitz coefficients of C: 1, Σ ω, Σ ω θ, …"""
        k = np.arange(max(n - 1, 0), dtype=np.float64)
        tail = (self.buf_decay[None, :] ** k[:, None] * self.output_scale[None, :]).sum(axis=1)
        return np.concatenate([[1.0], tail])[:n]

    def inverse(self) -> "BLT":
        """The BLT of ``C⁻¹``: its decays are the eigenvalues of diag(θ) − ω 1ᵀ, and its output scales follow
        from that matrix's eigenvectors, which have the closed form ω_i / (λ_j − θ_i)."""
        if self.buffers == 0:
            return self
        theta, omega = self.buf_decay, self.output_scale
        lam = np.linalg.eigvals(np.diag(theta) - np.outer(omega, np.ones_like(theta))).real
        vecs = omega[:, None] / (lam[None, :] - theta[:, None])
        scale = np.linalg.solve(vecs, -omega) * vecs.sum(axis=0)
        return BLT.build(lam, scale)

    def pillutla_score(self) -> float:
        """Σ ω_i / θ_i; below 1, the inverse has positive decays (McMahan and Pillutla 2025, Theorem 1)."""
        return float(np.sum(self.output_scale / self.buf_decay))

    @classmethod
    def from_rational_approximation(cls, buffers: int) -> "BLT":
        """A BLT close to the square-root factorisation: the inverse of the rational approximation of
        (1 − x)^{1/2} of Dvijotham et al. (2024, Proposition 4.5), pulled inside the well-behaved class
        (largest decay below 1, Pillutla score below 1). The optimiser's starting point."""
        d1 = (buffers + 1) // 2
        h = 1.6 * math.pi / math.sqrt(2 * (d1 + 1))
        ks = np.arange(-d1 + 1, buffers - d1 + 1, dtype=np.float64) - 1
        decay = 1.0 / (1.0 + np.exp(2 * h * ks))
        scale = -(decay ** 2) * np.exp(3 * h * ks) / np.sum(np.exp(h * ks) * decay)
        blt = cls.build(decay, scale).inverse()
        theta = blt.buf_decay * min(1.0, (1 - 1e-6) / blt.buf_decay[0])
        omega = blt.output_scale * min(1.0, (1 - 1e-6) / np.sum(blt.output_scale / theta))
        return cls.build(theta, omega)


# --- closed forms (torch, float64, differentiable) --------------------------------------------------------

def _geometric(log_r: torch.Tensor, one_minus_r: torch.Tensor, m: float) -> torch.Tensor:
    """Σ_{k<m} r^k = (1 − r^m)/(1 − r), from log r and 1 − r (both exact near r = 1)."""
    return -torch.expm1(m * log_r) / one_minus_r


def _scales(theta: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Output scales of the BLT with decays ``theta`` whose inverse has decays ``other``:
    ω_i = Π_j (θ_i − θ̂_j) / Π_{j≠i} (θ_i − θ_j) (McMahan and Pillutla 2025, Theorem 2)."""
    diff = theta[:, None] - theta[None, :]
    diff = diff + torch.eye(theta.numel(), dtype=theta.dtype)
    return torch.prod(theta[:, None] - other[None, :], dim=1) / torch.prod(diff, dim=1)


def _sens2_single(omega, theta, one_minus, log_theta, n: int) -> torch.Tensor:
    """‖C e_0‖², the squared first column of C over n steps (Lemma 5.3)."""
    log_pair = log_theta[:, None] + log_theta[None, :]
    pair = -torch.expm1(log_pair)
    return 1.0 + torch.sum(omega[:, None] * omega[None, :] * _geometric(log_pair, pair, n - 1))


def _max_error_closed(omega, theta, one_minus, log_theta, n: int) -> torch.Tensor:
    """Variance of the last (largest) of n prefix sums, for the noising BLT (ω, θ) (Lemma 5.4)."""
    g = _geometric(log_theta, one_minus, n)
    gamma = omega / one_minus * (1.0 - g / n)
    log_pair = log_theta[:, None] + log_theta[None, :]
    g_pair = _geometric(log_pair, -torch.expm1(log_pair), n)
    gamma2 = (omega[:, None] * omega[None, :] / (one_minus[:, None] * one_minus[None, :])
              * (n - g[:, None] - g[None, :] + g_pair) / n)
    return n * (1.0 + 2.0 * gamma.sum() + gamma2.sum())


def _coefs_t(omega: torch.Tensor, theta: torch.Tensor, n: int) -> torch.Tensor:
    k = torch.arange(n - 1, dtype=torch.float64)
    tail = (theta[None, :] ** k[:, None] * omega[None, :]).sum(dim=1)
    return torch.cat([torch.ones(1, dtype=torch.float64), tail])


def _minsep_sens2_t(coefs: torch.Tensor, n: int, min_sep: int, k: int) -> torch.Tensor:
    c = torch.flip(torch.cummax(torch.flip(coefs.abs(), [0]), 0).values, [0])
    pad = (-n) % min_sep
    every = torch.cat([c, c.new_zeros(pad)]).reshape(-1, min_sep).cumsum(0).reshape(-1)[:n]
    if k * min_sep < n:
        every = torch.cat([every[:k * min_sep], every[k * min_sep:] - every[:n - k * min_sep]])
    return every @ every


@dataclass(frozen=True)
class _Loss:
    n: int
    min_sep: int
    participations: int

    @property
    def closed_form(self) -> bool:
        return self.participations == 1

    def __call__(self, params: torch.Tensor, penalised: bool = True) -> torch.Tensor:
        b = params.numel() // 2
        u, v = params[:b], params[b:]
        theta, theta_inv = torch.sigmoid(u), torch.sigmoid(v)
        one_minus, one_minus_inv = torch.sigmoid(-u), torch.sigmoid(-v)
        log_theta, log_theta_inv = -torch.nn.functional.softplus(-u), -torch.nn.functional.softplus(-v)
        omega, omega_inv = _scales(theta, theta_inv), _scales(theta_inv, theta)
        n = self.n
        if self.closed_form:
            loss = (_sens2_single(omega, theta, one_minus, log_theta, n)
                    * _max_error_closed(omega_inv, theta_inv, one_minus_inv, log_theta_inv, n))
        else:
            noising = _coefs_t(omega_inv, theta_inv, n)
            err = torch.cumsum(torch.cumsum(noising, 0) ** 2, 0)[-1]
            loss = err * _minsep_sens2_t(_coefs_t(omega, theta, n), n, self.min_sep, self.participations)
        if not penalised:
            return loss
        loss = loss / (self.participations + (1 + math.log(n) / math.pi) ** 2)
        barrier = (torch.nn.functional.softplus(-u).sum() + torch.nn.functional.softplus(u).sum()
                   + torch.nn.functional.softplus(-v).sum() + torch.nn.functional.softplus(v).sum()
                   - torch.log(omega).sum() - torch.log(-omega_inv).sum()
                   - torch.log(1.0 - omega.sum()) - torch.log(1.0 - (omega / theta).sum()))
        if b > 1:
            off = ~torch.eye(b, dtype=torch.bool)
            for d in (theta, theta_inv):
                gap = (d[:, None] - d[None, :]).abs()[off].min()
                barrier = barrier - torch.log(gap - _MIN_GAP)
        return loss + _PENALTY * barrier


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _minimise(loss: Callable[[torch.Tensor], torch.Tensor], x0: np.ndarray, steps: int) -> tuple[float, np.ndarray]:
    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        value = loss(t)
        if not torch.isfinite(value):
            return math.inf, np.zeros_like(x)
        value.backward()
        return float(value.detach()), t.grad.numpy().copy()

    if not math.isfinite(fun(x0)[0]):
        return math.inf, x0
    result = minimize(fun, x0, jac=True, method="L-BFGS-B",
                      options={"maxiter": steps, "maxcor": 15, "ftol": 1e-12, "gtol": 1e-13, "maxls": 100})
    return float(result.fun), result.x


def _starts(n: int, buffers: int) -> list[list[np.ndarray]]:
    """Starting points (logits of θ and θ̂), in rounds: interlaced decays θ_1 > θ̂_1 > θ_2 > θ̂_2 > …
    (so ω > 0 and ω̂ < 0) with 1 − θ spread log-evenly over (1/n, 1) and 1 − θ̂ two or four times
    larger; then, only if neither is feasible, ten times larger and the rational approximation."""
    gaps = 0.5 * np.exp(np.log(1.0 / n) * (1 - np.linspace(0, 1, buffers + 2)[1:-1]))

    def interlaced(ratio: float) -> np.ndarray:
        return np.concatenate([_logit(1 - gaps), _logit(1 - np.minimum(gaps * ratio, 0.999))])

    rational = BLT.from_rational_approximation(buffers)
    return [[interlaced(2.0), interlaced(4.0)],
            [interlaced(10.0), np.concatenate([_logit(rational.buf_decay), _logit(rational.inverse().buf_decay)])]]


def _grown(blt: BLT) -> np.ndarray | None:
    """Starting point one buffer larger than ``blt``: a new buffer of half its smallest decay and a small
    output scale, so the start is ``blt`` almost exactly (more buffers then never lose to fewer). None
    where the grown BLT's inverse has a decay outside (0, 1) (its ω_i ≈ θ_i), which has no logits."""
    theta = np.append(blt.buf_decay, 0.5 * blt.buf_decay[-1])
    omega = np.append(blt.output_scale, 1e-3 * blt.output_scale.min())
    grown = BLT.build(theta, omega)
    decays = np.concatenate([grown.buf_decay, grown.inverse().buf_decay])
    if not np.all((decays > 0.0) & (decays < 1.0)):
        return None
    return _logit(decays)


def optimize_blt(n: int, buffers: int, min_sep: int = 1, participations: int | None = 1,
                 steps: int = 1000, init: BLT | None = None) -> BLT:
    """The BLT with ``buffers`` buffers that minimises the max loss over ``n`` steps for participations at
    least ``min_sep`` apart, at most ``participations`` of them (None: as many as fit). The loss is not
    convex: L-BFGS runs from two fixed starting points (:func:`_starts`), and from ``init`` grown by one
    buffer when given (a BLT with one buffer fewer), and the best end point wins."""
    if n < 1 or buffers < 0:
        raise ValueError(f"n must be >= 1 and buffers >= 0, got n={n}, buffers={buffers}")
    k = max_participations(n, min_sep, participations)
    if buffers == 0 or n == 1:
        return BLT.build([], [])
    loss = _Loss(n, min_sep, k)
    value, x = math.inf, np.zeros(2 * buffers)
    rounds = _starts(n, buffers)
    grown = _grown(init) if init is not None and init.buffers == buffers - 1 and buffers > 1 else None
    if grown is not None:
        rounds[0].insert(0, grown)
    for starts in rounds:
        value, x = min((_minimise(loss, x0, steps) for x0 in starts), key=lambda r: r[0])
        if math.isfinite(value):
            break
    else:
        raise RuntimeError(f"no BLT with {buffers} buffers found for n={n}, min_sep={min_sep}")
    theta, theta_inv = 1.0 / (1.0 + np.exp(-x[:buffers])), 1.0 / (1.0 + np.exp(-x[buffers:]))
    omega = _scales(torch.tensor(theta), torch.tensor(theta_inv)).numpy()
    return BLT.build(theta, omega)


def blt_sensitivity_squared(blt: BLT, n: int, min_sep: int = 1, participations: int | None = 1) -> float:
    """Squared sensitivity of the BLT strategy under min-separation participation (McMahan et al. 2024,
    Theorem 2; exact for the non-negative, non-increasing coefficients of the well-behaved class)."""
    return minsep_sensitivity_squared(blt.coefs(n), n, min_sep, participations)


def blt_max_error(blt: BLT, n: int) -> float:
    """Variance of the largest-error prefix sum (the last) for unit noise, from the inverse's closed form."""
    inv = blt.inverse()
    if inv.buffers == 0:
        return float(n)
    theta = torch.tensor(inv.buf_decay)
    return float(_max_error_closed(torch.tensor(inv.output_scale), theta, 1.0 - theta, torch.log(theta), n))


def blt_max_loss(blt: BLT, n: int, min_sep: int = 1, participations: int | None = 1) -> float:
    """max error × sensitivity²: what :func:`optimize_blt` minimises."""
    return blt_max_error(blt, n) * blt_sensitivity_squared(blt, n, min_sep, participations)


class BLTNoise:
    """The correlated noise ``(C⁻¹ z)_t`` of a BLT strategy, one step at a time, with one buffer of the
    noise's shape per BLT buffer (float64). ``z_t`` is supplied by the caller (raysim draws it from a keyed
    stream), so the state is all a checkpoint needs: :meth:`state_dict` / :meth:`load_state_dict`."""

    def __init__(self, blt: BLT, size: int) -> None:
        self.decay = torch.tensor(blt.buf_decay, dtype=torch.float64)
        self.scale = torch.tensor(blt.output_scale, dtype=torch.float64)
        self.buffers = torch.zeros((blt.buffers, size), dtype=torch.float64)

    def step(self, z: torch.Tensor) -> torch.Tensor:
        """The next noise vector from the next i.i.d. draw ``z`` (float64)."""
        w = z.double() - self.scale @ self.buffers if len(self.scale) else z.double().clone()
        self.buffers.mul_(self.decay[:, None]).add_(w[None, :])
        return w

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"buffers": self.buffers.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.buffers = state["buffers"].clone()


def strategy_sensitivity(blt: BLTStrategy, rounds: int, groups: int) -> float:
    """Sensitivity of the first ``rounds`` rows of the BLT strategy, participations ``groups`` apart."""
    return math.sqrt(blt_sensitivity_squared(blt.blt, rounds, groups, max_participations(rounds, groups)))


#: A BLT run starts with 1 buffer and adds one while the loss improves by more than this factor (at most 4).
BLT_BUFFER_GAIN = 1.01
BLT_MAX_BUFFERS = 4


@dataclass(frozen=True)
class BLTStrategy:
    """A BLT optimised for a run: ``rounds`` T, its groups G (the minimum separation)."""

    blt: BLT
    rounds: int

    @property
    def buffers(self) -> int:
        return self.blt.buffers


@functools.lru_cache(maxsize=16)
def blt_for(rounds: int, groups: int) -> BLTStrategy:
    """The BLT for T rounds and participations G apart (at most ⌈T/G⌉): buffers added while they help.
    A pure function of (T, G), kept for the process's later runs (a sweep, a resumed run)."""
    k = max_participations(rounds, groups)
    best, best_loss = BLT.build([], []), blt_max_loss(BLT.build([], []), rounds, groups, k)
    for buffers in range(1, BLT_MAX_BUFFERS + 1):
        try:
            blt = optimize_blt(rounds, buffers, groups, k, init=best if best.buffers else None)
        except RuntimeError:   # no feasible end point with this many buffers: keep the best so far
            break
        loss = blt_max_loss(blt, rounds, groups, k)
        if not loss * BLT_BUFFER_GAIN < best_loss:
            break
        best, best_loss = blt, loss
    return BLTStrategy(best, rounds)
