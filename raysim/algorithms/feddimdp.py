"""FedDimDP (docs/methods.md): LLDM client model + ADPC adaptive clipping + CRA robust aggregation.

The three components are switches of the one method, ``feddimdp.lldm``, ``feddimdp.adpc`` and
``feddimdp.cra`` (all true by default); with all three off the method is FedSA (DP-SGD at a fixed C,
FedAvg weights), bit for bit. The paper's ablation names are presets of the switches:
``feddimdp-no-lldm``, ``feddimdp-no-adpc``, ``feddimdp-no-cra``.

* LLDM: the client model gets the 1x1 channel reduction and the top-k gradient sparsifier.
* ADPC: C^(t+1) = max(median_i S_i^(t), C_min), optionally smoothed. The default statistic (R)
  ``example_norm_median`` is each client's quantile of its per-example gradient norms at the round's
  starting model (the pre-round norm pass over all its examples, weight 1 each), read from a
  histogram that the client noises itself (a Gaussian release of sensitivity 1 per round,
  composed into its ledger); ``adpc.read=pooled`` (R) instead reads one quantile from the cohort's
  histograms summed. ``adpc.step=normalized`` (R) scales the local lr by C^(0)/C^(t). Both are
  post-processing of the same releases. The literal update-norm statistics are kept as options; they are
  post-processing of Δw_i and degenerate (docs/methods.md). Off: C = ``privacy.clip_norm`` fixed.
* CRA: reliability-weighted aggregation with one projected step onto the capped simplex. Its utility
  signal q_i (R, ``cra.utility``) is the local validation macro-F1, noised by the client and composed
  into its ledger (``cra.private_val_f1``, default; un-noised only with ``privacy.allow_uncovered:
  [cra.local_val_f1]``), or the macro-F1 of w + Δw_i on the public server hold-out (post-processing).
  Off: FedAvg weights n_i / Σ n_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server, client_level_gaussian, weighted_sum
from raysim.algorithms.clip_rules import (
    adpc_next_clip, denoise_update_norm, example_norm_histogram, histogram_edges, histogram_quantile,
    norm_quantile, normalized_lr_scale, pooled_histogram_quantile, update_norm_per_step,
)
from raysim.algorithms.cra_math import cra_weights
from raysim.algorithms.registry import register
from raysim.algorithms.uploads import Release, Upload, UploadContext
from raysim.config import Config, ConfigError, check_choice, fail
from raysim.metrics import evaluate
from raysim.messages import ClientResult


# --------------------------------------------------------------------------- parameters (config sections)

@dataclass(frozen=True)
class FedDimDPParams:
    """``feddimdp.*``: the three components as switches (all off = FedSA). Unset (null) means on, or the
    value of the method's preset (``feddimdp-no-adpc`` sets ``adpc`` to false)."""

    lldm: bool | None = None
    adpc: bool | None = None
    cra: bool | None = None

    def on(self, component: str) -> bool:
        value = getattr(self, component)
        return True if value is None else bool(value)


@dataclass(frozen=True)
class LLDMParams:
    """``lldm.*``: the client model's channel reduction and gradient sparsifier."""

    reduction: float = 0.5             # (R) 1x1 conv channel ratio r
    keep_fraction: float = 0.5         # (R) top-k fraction κ of gradient entries kept

    def check(self, cfg: Config) -> None:
        for key in ("reduction", "keep_fraction"):
            if not 0 < getattr(self, key) <= 1:
                fail(f"lldm.{key}", f"must be in (0, 1], got {getattr(self, key)}")


ADPC_STATISTICS = ("example_norm_median", "update_norm", "update_norm_per_step", "update_norm_denoised")
ADPC_READS = ("per_client", "pooled")
ADPC_STEPS = ("coupled", "normalized")


@dataclass(frozen=True)
class ADPCParams:
    """``adpc.*``: adaptive clipping."""

    c0: float = 1.0                    # (R) C^(0)
    c_min: float = 0.1                 # (R) floor
    smoothing: float = 1.0             # (R) γ, 1 = no smoothing
    statistic: str = "example_norm_median"  # (R) S^(t): one of ADPC_STATISTICS
    quantile: float = 0.5              # (R) quantile of each client's per-example norms (0.5: the paper's "median")
    histogram_bins: int = 48           # (R) log-spaced bins on [histogram_min, histogram_max], plus under/overflow
    histogram_min: float = 1e-3
    histogram_max: float = 1e3
    histogram_noise_multiplier: float = 25.0  # (R) σ_h of the per-round histogram release (sensitivity 1); docs/methods.md
    read: str = "pooled"               # (R) pooled (quantile of the summed histograms) | per_client (each histogram's
                                       # quantile, then their median); default measured: docs/methods.md
    step: str = "normalized"           # (R) normalized (local lr scaled by C^(0)/C^(t)) | coupled (local lr fixed)

    def check(self, cfg: Config) -> None:
        check_choice("adpc.statistic", self.statistic, ADPC_STATISTICS)
        if not 0 < self.quantile < 1:
            fail("adpc.quantile", f"must be in (0, 1), got {self.quantile}")
        if self.histogram_bins < 1:
            fail("adpc.histogram_bins", f"must be >= 1, got {self.histogram_bins}")
        if not 0 < self.histogram_min < self.histogram_max:
            fail("adpc.histogram_min", f"need 0 < adpc.histogram_min < adpc.histogram_max, got "
                                       f"{self.histogram_min}, {self.histogram_max}")
        if not self.histogram_noise_multiplier > 0:
            fail("adpc.histogram_noise_multiplier", f"must be > 0 (the histogram is a private release), "
                                                    f"got {self.histogram_noise_multiplier}")
        check_choice("adpc.read", self.read, ADPC_READS)
        check_choice("adpc.step", self.step, ADPC_STEPS)
        if not 0 < self.smoothing <= 1:
            fail("adpc.smoothing", f"must be in (0, 1], got {self.smoothing}")
        if not 0 < self.c_min <= self.c0:
            fail("adpc.c_min", f"must be in (0, adpc.c0], got {self.c_min}")


@dataclass(frozen=True)
class CRAParams:
    """``cra.*``: constraint-aware robust aggregation."""

    beta: float = 0.9                  # (R) EMA factor
    rho: float = 1.5                   # (R) ambiguity-set cap p_i <= ρ α_i
    eta_p: float = 0.05                # (R) projected step size
    weight_by_samples: bool = True     # (R) α_i ∝ n_i r_i (False: ∝ r_i)
    eta_g: float = 1.0                 # global step
    utility: str = "local_val_f1"      # (R) q_i: local_val_f1 (client's own val split) | server_val_f1 (public hold-out)
    private_val_f1: bool = True        # noise q_i and account it in the same ledger (false: q_i uploaded as is,
                                       # needs privacy.allow_uncovered: [cra.local_val_f1]; docs/methods.md)
    val_f1_noise_multiplier: float = 20.0  # σ of the q_i release: noise std = σ · sensitivity
    val_f1_sensitivity: float = 1.0    # macro-F1 ∈ [0, 1], so 1 bounds its sensitivity; >= 1 (a larger value adds noise)

    def check(self, cfg: Config) -> None:
        check_choice("cra.utility", self.utility, ("local_val_f1", "server_val_f1"))
        if self.utility == "server_val_f1" and cfg.data.server_holdout == 0:
            fail("data.server_holdout", "cra.utility=server_val_f1 scores uploads on the public server hold-out; "
                                        "set data.server_holdout > 0 (e.g. 500) or leave it unset")
        if not 0 <= self.beta < 1:
            fail("cra.beta", f"must be in [0, 1), got {self.beta}")
        if not self.rho >= 1:
            fail("cra.rho", f"must be >= 1 (else the ambiguity set can be empty), got {self.rho}")
        if not self.eta_p >= 0:
            fail("cra.eta_p", f"must be >= 0, got {self.eta_p}")
        if not self.eta_g > 0:
            fail("cra.eta_g", f"must be > 0, got {self.eta_g}")
        if self.private_val_f1 and not self.val_f1_noise_multiplier > 0:
            fail("cra.val_f1_noise_multiplier", f"must be > 0 while cra.private_val_f1 is true (to upload q_i "
                                                f"un-noised, set cra.private_val_f1=false and opt in by name), "
                                                f"got {self.val_f1_noise_multiplier}")
        if not self.val_f1_sensitivity >= 1:
            fail("cra.val_f1_sensitivity", f"must be >= 1: q_i is a macro-F1 in [0, 1], so one client's q_i can move "
                                           f"by 1, and the noise std is σ times this bound; got {self.val_f1_sensitivity}")

    def holdout_default(self) -> int:
        """Images of the public server hold-out when ``data.server_holdout`` is unset."""
        return 500 if self.utility == "server_val_f1" else 0


PARAMS = {"feddimdp": FedDimDPParams, "lldm": LLDMParams, "adpc": ADPCParams, "cra": CRAParams}


def adpc_edges(cfg: Config) -> np.ndarray:
    a = cfg.adpc
    return histogram_edges(a.histogram_bins, a.histogram_min, a.histogram_max)


def _noisy_norm_histogram(ctx: UploadContext) -> np.ndarray:
    """The client's release: its round's norm histogram plus N(0, σ_h²) in every cell, noised here,
    from the client's own stream ``(seed, "adpc-histogram-noise", round, client)``, before upload."""
    counts = example_norm_histogram(ctx.example_norms, adpc_edges(ctx.cfg))
    noise = ctx.rng("adpc-histogram-noise").normal(0.0, ctx.cfg.adpc.histogram_noise_multiplier, counts.shape)
    return counts + noise


def _true_example_norm_quantile(ctx: UploadContext) -> float:
    return norm_quantile(ctx.example_norms, ctx.cfg.adpc.quantile)


def _local_val_f1(ctx: UploadContext) -> float:
    """q_i: macro-F1 of the trained local model on the client's validation split; with
    ``cra.private_val_f1`` plus N(0, (σ·sensitivity)²) from the client's own stream, clamped to [0, 1]."""
    cfg = ctx.cfg
    q = evaluate(ctx.model, ctx.val_x, ctx.val_y, ctx.num_classes, cfg.eval_batch_size).f1 if len(ctx.val_y) else 0.0
    if cfg.cra.private_val_f1:
        q += ctx.rng("val-f1-noise").normal(0.0, cfg.cra.val_f1_noise_multiplier * cfg.cra.val_f1_sensitivity)
        q = float(np.clip(q, 0.0, 1.0))
    return float(q)


def feddimdp_uploads(cfg: Config) -> tuple[Upload, ...]:
    sw, out = cfg.feddimdp, []
    if sw.on("adpc") and cfg.adpc.statistic == "example_norm_median":
        out.append(Upload("norm_histogram", "ADPC's histogram of per-example gradient norms", _noisy_norm_histogram,
                          Release("gaussian", cfg.adpc.histogram_noise_multiplier), ("example_norm_median",),
                          needs_example_norms=True))
        out.append(Upload("example_norm_median_true", "true quantile of the round's per-example gradient norms",
                          _true_example_norm_quantile, Release("diagnostic"), ("example_norm_median_true",),
                          needs_example_norms=True))
    if sw.on("cra") and cfg.cra.utility == "local_val_f1":
        release = (Release("gaussian", cfg.cra.val_f1_noise_multiplier) if cfg.cra.private_val_f1
                   else Release("not_covered"))
        out.append(Upload("val_f1", "q_i, CRA's macro-F1 on the local validation split", _local_val_f1, release, ("val_f1",),
                          opt_in="cra.local_val_f1"))
    return tuple(out)


def _client_level(cfg: Config) -> str | None:
    """LLDM is a model change and carries over; ADPC and CRA have no client-level form (docs/methods.md)."""
    on = [name for name in ("adpc", "cra") if cfg.feddimdp.on(name)]
    prefix = client_level_gaussian(cfg)
    if prefix is not None:
        return prefix
    if on:
        return (f"{' and '.join(c.upper() for c in on)} {'need' if len(on) > 1 else 'needs'} per-client statistics "
                f"at the server (ADPC a histogram of per-example gradient norms, CRA each client's utility and "
                f"update norm) that have no sound client-level form here: set "
                f"{' and '.join(f'feddimdp.{c}=false' for c in on)} (LLDM carries over)")
    return None


def feddimdp_validate(cfg: Config, clipping: str) -> None:
    if cfg.feddimdp.on("adpc") and cfg.adpc.statistic == "example_norm_median" and clipping == "batch":
        raise ConfigError("config key 'adpc.statistic': example_norm_median needs per-example gradient norms, which "
                          "privacy.clipping=batch does not compute; use privacy.clipping=per_sample, "
                          "adpc.statistic=update_norm|update_norm_per_step|update_norm_denoised, or feddimdp.adpc=false")


def _rows(state: np.ndarray | None, ids: np.ndarray) -> np.ndarray | None:
    """The EMA entries of the reporting clients (NaN: never reported), or None before any report."""
    return None if state is None else state[ids]


def _store(state: np.ndarray | None, ids: np.ndarray, values: np.ndarray, num_clients: int) -> np.ndarray:
    """CRA's EMAs, one entry per client id: updated for the clients that reported, kept for the absent."""
    out = np.full(num_clients, np.nan) if state is None else state.copy()
    out[ids] = values
    return out


class FedDimDPServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        sw = self.cfg.feddimdp
        self.use_adpc, self.use_cra = sw.on("adpc"), sw.on("cra")
        # ADPC starts at C^(0); without ADPC, C is fixed at privacy.clip_norm like every fixed-clip method.
        self.current_clip = float(self.cfg.adpc.c0 if self.use_adpc else self.cfg.privacy.clip_norm)
        self.val_f1_ema: np.ndarray | None = None
        self.update_norm_ema: np.ndarray | None = None

    def clip_norm(self, server_round: int) -> float:
        return self.current_clip

    def lr_scale(self, server_round: int) -> float:
        """``adpc.step`` (R): 1 (coupled: the step grows with C) or C^(0)/C^(t) (normalized)."""
        if self.use_adpc and self.cfg.adpc.step == "normalized":
            return normalized_lr_scale(self.cfg.adpc.c0, self.current_clip)
        return 1.0

    def utility(self, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> np.ndarray:
        """CRA's q_i (``cra.utility``, R)."""
        if self.cfg.cra.utility == "server_val_f1":
            if self.ctx.holdout_f1 is None:
                raise RuntimeError("cra.utility=server_val_f1 needs the server hold-out (data.server_holdout > 0)")
            return np.array([self.ctx.holdout_f1(global_weights + r.delta) for r in results], dtype=np.float64)
        return np.array([r.uploads["val_f1"] for r in results], dtype=np.float64)

    def adpc_statistic(self, results: Sequence[ClientResult], raw: np.ndarray, per_step: np.ndarray,
                       logs: list[dict[str, float]]) -> np.ndarray:
        """S^(t) of ``adpc.statistic`` (R) in C's units (NaN: no information): one value per client, or with
        ``adpc.read=pooled`` the one quantile of the summed histograms. ``adpc.read`` is how histograms are
        read: the update-norm statistics upload one number per client, whose median C^(t+1) always takes."""
        cfg, ctx = self.cfg, self.ctx
        stat = cfg.adpc.statistic
        if stat == "example_norm_median":
            edges, hists = adpc_edges(cfg), [r.uploads["norm_histogram"] for r in results]
            values = np.array([histogram_quantile(h, edges, cfg.adpc.quantile) for h in hists])
            for row, v in zip(logs, values):
                row["example_norm_median"] = float(v)   # each client's own read, logged under either adpc.read
            if cfg.adpc.read == "pooled":
                return np.array([pooled_histogram_quantile(hists, edges, cfg.adpc.quantile)])
            return values
        if stat == "update_norm":
            return raw
        if stat == "update_norm_per_step":
            return per_step
        values = np.array([
            denoise_update_norm(per_step[i], num_params=ctx.num_params,
                                noise_multiplier=self.noise_multiplier(r.client_id, r.server_round),
                                clip_norm=self.current_clip, expected_batch_size=min(cfg.batch_size, r.num_samples),
                                num_steps=r.num_steps, mode=ctx.clipping)
            for i, r in enumerate(results)])
        for row, v in zip(logs, values):
            row["update_norm_denoised"] = float(v)
        return values

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        cfg = self.cfg
        raw = np.array([r.update_norm() for r in results])
        lr = cfg.lr * self.lr_scale(server_round)   # the lr the clients stepped with (C^(t) not yet moved)
        per_step = np.array([update_norm_per_step(raw[i], lr, r.num_steps) for i, r in enumerate(results)])
        logs: list[dict[str, float]] = [{} for _ in results]
        if self.use_cra:
            deltas = torch.stack([r.delta for r in results]).numpy()
            q = self.utility(global_weights, results)
            n = np.array([r.num_samples for r in results], dtype=np.float64)
            ids = np.array([r.client_id for r in results], dtype=np.int64)
            res = cra_weights(deltas, q, per_step, n, _rows(self.val_f1_ema, ids), _rows(self.update_norm_ema, ids),
                              beta=cfg.cra.beta, rho=cfg.cra.rho, eta_p=cfg.cra.eta_p,
                              weight_by_samples=cfg.cra.weight_by_samples)
            self.val_f1_ema = _store(self.val_f1_ema, ids, res.val_f1_ema, cfg.num_clients)
            self.update_norm_ema = _store(self.update_norm_ema, ids, res.update_norm_ema, cfg.num_clients)
            weights, step_size = res.robust_weight, cfg.cra.eta_g
            for i, row in enumerate(logs):
                row.update(val_f1=q[i], update_norm_per_step=per_step[i], val_f1_ema=res.val_f1_ema[i],
                           update_norm_ema=res.update_norm_ema[i], reliability=res.reliability[i],
                           nominal_weight=res.nominal_weight[i], deviation=res.deviation[i],
                           deviation_normalized=res.deviation_normalized[i], robust_weight=res.robust_weight[i])
            new_weights = global_weights + step_size * weighted_sum([r.delta for r in results], weights)
        else:   # the only branch under privacy.unit=client, which refuses ADPC and CRA
            mean, mean_logs = self.mean_update(server_round, results)
            weights = np.array([row["aggregation_weight"] for row in mean_logs])
            new_weights = global_weights + mean.to(global_weights.dtype)
        for row, w in zip(logs, weights):
            row["aggregation_weight"] = float(w)
        round_logs: dict[str, float] = {}
        if self.use_adpc:
            values = self.adpc_statistic(results, raw, per_step, logs)
            finite = values[np.isfinite(values)]
            if finite.size:   # an all-empty round (every histogram noised to ≤ 0) keeps C
                self.current_clip = adpc_next_clip(finite, self.current_clip, c_min=cfg.adpc.c_min,
                                                   smoothing=cfg.adpc.smoothing)
            round_logs["next_clip_norm"] = self.current_clip
        return Aggregate(new_weights, logs, round_logs)


#: What FedDimDP logs per client besides the generic columns (ADPC's statistics, CRA's quantities).
CLIENT_COLUMNS = (
    ("update_norm_per_step", "float64"), ("update_norm_denoised", "float64"),
    ("example_norm_median", "float64"),        # ADPC: the quantile the server reads from the noised histogram
    ("example_norm_median_true", "float64"),   # the true quantile: a simulation diagnostic, never uploaded
    ("val_f1", "float64"), ("val_f1_ema", "float64"), ("update_norm_ema", "float64"), ("reliability", "float64"),
    ("nominal_weight", "float64"), ("deviation", "float64"), ("deviation_normalized", "float64"),
    ("robust_weight", "float64"),
)

_SOURCE = "FedDimDP, arXiv 2602.06838 (withdrawn); reconstructed (docs/methods.md)"


def _model_options(cfg: Config) -> dict[str, Any]:
    """LLDM's block in the client model (``raysim.models.build_backbone``), when the switch is on."""
    if not cfg.feddimdp.on("lldm"):
        return {}
    return {"lldm": True, "lldm_reduction": cfg.lldm.reduction, "lldm_keep_fraction": cfg.lldm.keep_fraction}


def _uses_section(cfg: Config, name: str) -> bool:
    """``feddimdp.*`` always; ``lldm``, ``adpc`` and ``cra`` only with their component switched on."""
    return name == "feddimdp" or cfg.feddimdp.on(name)


def _uses_adpc(cfg: Config) -> bool:
    return cfg.feddimdp.on("adpc")


def _feddimdp(name: str, summary: str, preset: dict[str, bool]) -> MethodSpec:
    return register(MethodSpec(name, summary, _SOURCE, FedDimDPServer, model_options=_model_options,
                               uploads=feddimdp_uploads, validate=feddimdp_validate, preset=preset,
                               preset_of="feddimdp" if preset else None, adaptive_clip=_uses_adpc, params=PARAMS,
                               uses_section=_uses_section, client_level=_client_level,
                               client_level_note="LLDM only: feddimdp.adpc=false and feddimdp.cra=false",
                               client_columns=CLIENT_COLUMNS, round_columns=(("next_clip_norm", "float64"),)))


_feddimdp("feddimdp", "FedDimDP: LLDM + ADPC adaptive clipping + CRA robust aggregation (switches feddimdp.*)", {})
_feddimdp("feddimdp-no-cra", "FedDimDP ablation w/o CRA (FedAvg weights); preset feddimdp.cra=false",
          {"feddimdp.cra": False})
_feddimdp("feddimdp-no-adpc", "FedDimDP ablation w/o ADPC (fixed C = privacy.clip_norm); preset feddimdp.adpc=false",
          {"feddimdp.adpc": False})
_feddimdp("feddimdp-no-lldm", "FedDimDP ablation w/o LLDM (plain backbone); preset feddimdp.lldm=false",
          {"feddimdp.lldm": False})
