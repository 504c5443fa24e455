"""Frozen, validated configuration.

YAML (or a dict) in, a tree of frozen dataclasses out. Every key a user can set is a field
here; an unknown key, a wrong type or an out-of-range value raises ``ConfigError`` (a
``ValueError``) with a one-line message naming the key. Keys marked *(R)* in the field
comments are reconstructions of choices the FedDimDP paper does not state (see
docs/methods.md); their defaults follow SPEC.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

__all__ = ["ConfigError", "Config", "load_config", "config_from_dict", "apply_overrides", "config_to_dict",
           "config_hash", "parse_override", "run_id_for", "result_hash", "CLIPPING_MODES", "PARTICIPATION_MODES",
           "MODEL_NAMES"]

#: ``participation`` modes (R): how a round's clients are drawn when ``clients_per_round`` is set.
PARTICIPATION_MODES = ("uniform", "poisson")

#: ``privacy.clipping`` modes once resolved (``auto`` resolves to one of them).
CLIPPING_MODES = ("per_sample", "batch", "none")
#: Backbones of the top-level ``model`` key, built by ``raysim.models.model_for``.
MODEL_NAMES = ("cnn", "resnet18_gn", "wrn16_4")


class ConfigError(ValueError):
    """A configuration a user wrote is invalid."""


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    root: str | None = None            # --data-root; where cifar10/, svhn/, stl10/ live
    download: bool = False             # only then may torchvision download
    cache_dir: str | None = None       # decoded-array cache; default ~/.cache/raysim
    partition: str = "dirichlet"       # iid | dirichlet | shards
    alpha: float = 0.3                 # Dirichlet concentration
    min_samples_per_client: int = 10
    shards_per_client: int = 2         # (R) SVHN class-grouped partition
    shard_size_sigma: float = 1.0      # (R) log-normal quantity skew of the shards partitioner
    val_fraction: float = 0.1          # (R) local validation split for CRA's q_i
    train_subsample: int | None = None  # keep a fixed subset of this many training images, the same for every
                                        # seed (stream (0, "train-subsample")): a smaller data set for quick studies
    test_subsample: int | None = None  # evaluate on a seeded subset of the test split (None = all)
    server_holdout: int | None = None  # public server hold-out (training images removed before partitioning,
                                       # owned by no client); None: 500 with cra.utility=server_val_f1, else 0


@dataclass(frozen=True)
class PrivacyConfig:
    clipping: str = "auto"             # per_sample | batch | none | auto (DP methods: per_sample)
    clip_norm: float = 1.0             # C for fixed-clip methods; ADPC starts from adpc.c0
    epsilon: float | None = None       # target ε for the whole run, per client
    delta: float = 1e-5                # (R) δ is not stated in the paper
    noise_multiplier: float | None = None  # σ; give σ or ε, not both
    accountant: str = "pld"            # pld | rdp
    engine: str = "bk"                 # per-sample gradient engine


@dataclass(frozen=True)
class RuntimeConfig:
    executor: str = "ray"              # ray | serial
    address: str | None = None         # join an existing Ray cluster (--address)
    num_actors: int | None = None      # client actors; default one per client
    num_cpus_per_client: float | None = None  # default: fit all actors on the cluster's CPUs (≤ 1)
    num_gpus_per_client: float = 0.0
    gpu_memory_fraction: float | None = None  # explicit per-actor CUDA memory cap
    torch_threads: int = 1             # per actor and serial executor; the bits are the same on every executor
                                       # at one value, and change in the last place across values (MKL's small
                                       # matmuls split their sums by thread count; docs/cluster.md)
    max_actor_restarts: int = 3
    checkpoint_every: int = 1          # save a resumable checkpoint every k rounds (0: never)
    eval_on: str = "auto"              # where the global model is evaluated: driver | actor (a client actor,
                                       # on its GPU share if it has one) | auto (actor when clients have GPUs)
    malloc_tuning: bool = True         # keep multi-MB buffers in the heap (raysim.allocator); speed only


@dataclass(frozen=True)
class LLDMConfig:
    reduction: float = 0.5             # (R) 1x1 conv channel ratio r
    keep_fraction: float = 0.5         # (R) top-k fraction κ of gradient entries kept


ADPC_STATISTICS = ("example_norm_median", "update_norm", "update_norm_per_step", "update_norm_denoised")
ADPC_READS = ("per_client", "pooled")
ADPC_STEPS = ("coupled", "normalized")


@dataclass(frozen=True)
class FedDimDPConfig:
    # The three components of FedDimDP as switches (all off = FedSA). Unset (null) means on, or the
    # value of the method's preset (feddimdp-no-adpc sets adpc to false).
    lldm: bool | None = None
    adpc: bool | None = None
    cra: bool | None = None

    def on(self, component: str) -> bool:
        value = getattr(self, component)
        return True if value is None else bool(value)


@dataclass(frozen=True)
class ADPCConfig:
    c0: float = 1.0                    # (R) C^(0)
    c_min: float = 0.1                 # (R) floor
    smoothing: float = 1.0             # (R) γ, 1 = no smoothing
    statistic: str = "example_norm_median"  # (R) S^(t): example_norm_median | update_norm | update_norm_per_step | update_norm_denoised
    quantile: float = 0.5              # (R) quantile of each client's per-example norms (0.5: the paper's "median")
    histogram_bins: int = 48           # (R) log-spaced bins on [histogram_min, histogram_max], plus under/overflow
    histogram_min: float = 1e-3
    histogram_max: float = 1e3
    histogram_noise_multiplier: float = 25.0  # (R) σ_h of the per-round histogram release (sensitivity 1); see docs/methods.md
    read: str = "per_client"           # (R) per_client (each histogram's quantile, then their median) | pooled (quantile of the summed histograms)
    step: str = "coupled"              # (R) coupled (local lr fixed) | normalized (local lr scaled by C^(0)/C^(t))


@dataclass(frozen=True)
class CRAConfig:
    beta: float = 0.9                  # (R) EMA factor
    rho: float = 1.5                   # (R) ambiguity-set cap p_i <= ρ α_i
    eta_p: float = 0.05                # (R) projected step size
    weight_by_samples: bool = True     # (R) α_i ∝ n_i r_i (False: ∝ r_i)
    eta_g: float = 1.0                 # global step
    utility: str = "local_val_f1"      # (R) q_i: local_val_f1 (client's own val split) | server_val_f1 (public hold-out)
    private_val_f1: bool = False       # noise q_i and account it in the same ledger
    val_f1_noise_multiplier: float = 20.0  # σ of the q_i release: noise std = σ · sensitivity
    val_f1_sensitivity: float = 1.0    # macro-F1 ∈ [0, 1]; 1 is the safe worst-case bound


@dataclass(frozen=True)
class SAMConfig:
    rho: float = 0.05                  # (R) perturbation radius for this CNN
    mode: str = "previous"             # (R) previous (1 release/step) | both (2 releases/step)


@dataclass(frozen=True)
class FedACGConfig:
    lam: float = 0.85
    beta: float = 0.001


@dataclass(frozen=True)
class ACDNConfig:
    gamma: float = 0.99                # (R) σ_t = σ_0 γ^t
    momentum: float = 0.9              # (R) server EMA of aggregated updates


@dataclass(frozen=True)
class AWDPConfig:
    beta: float = 0.9                  # (R) EMA of per-layer gradient norms


@dataclass(frozen=True)
class QuantileConfig:
    eta_c: float = 0.2
    target_quantile: float = 0.5
    noise_multiplier: float = 0.0      # σ_b of the clipped-count release (0: not private)
    norm_source: str = "per_example"   # (R) per_example (fraction of unclipped examples) | update (‖Δw‖ per step)


@dataclass(frozen=True)
class FedProxConfig:
    mu: float = 0.01


@dataclass(frozen=True)
class Config:
    method: str = "fedavg"
    model: str = "cnn"  # backbone, one of MODEL_NAMES (see docs/methods.md, "Backbones")
    rounds: int = 10
    seed: int = 0
    replicate: int = 0                 # training replicate of the federation `seed`: 0 uses the seed's own training
                                       # streams; k > 0 independent ones (see Config.train_seed)
    num_clients: int = 10
    clients_per_round: int | None = None  # k clients train per round (None: all clients, every round)
    participation: str = "uniform"     # (R) how the k are drawn: uniform (exactly k, without replacement) |
                                       # poisson (each client independently with probability k/N)
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.0
    eval_batch_size: int = 1000
    eval_every: int = 1                # evaluate the global model every k rounds, and always after the last one
    data: DataConfig = field(default_factory=DataConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    feddimdp: FedDimDPConfig = field(default_factory=FedDimDPConfig)
    lldm: LLDMConfig = field(default_factory=LLDMConfig)
    adpc: ADPCConfig = field(default_factory=ADPCConfig)
    cra: CRAConfig = field(default_factory=CRAConfig)
    sam: SAMConfig = field(default_factory=SAMConfig)
    fedacg: FedACGConfig = field(default_factory=FedACGConfig)
    acdn: ACDNConfig = field(default_factory=ACDNConfig)
    awdp: AWDPConfig = field(default_factory=AWDPConfig)
    quantile: QuantileConfig = field(default_factory=QuantileConfig)
    fedprox: FedProxConfig = field(default_factory=FedProxConfig)

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    @property
    def train_seed(self) -> int:
        """Seed of the training streams: model init, batches, DP noise, upload noise, server noise.

        ``seed`` itself for ``replicate`` 0, and an independent seed per replicate otherwise. The data
        streams (server hold-out, partition, validation split, test subsample, participation schedule)
        always use ``seed``, so replicates train the same federation with independent randomness (what
        private hyperparameter tuning needs of repeated candidates)."""
        if self.replicate == 0:
            return self.seed
        digest = hashlib.sha256(f"raysim-replicate/{self.seed}/{self.replicate}".encode()).hexdigest()
        return int(digest[:15], 16)


# --------------------------------------------------------------------------- building

def _fail(key: str, msg: str) -> typing.NoReturn:
    raise ConfigError(f"config key '{key}': {msg}")


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if annotation is bool:
        if isinstance(value, bool):
            return value
        _fail(key, f"expected true/false, got {value!r}")
    if annotation in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "1e-5" as a string; numbers written that way are still numbers.
        try:
            value = float(value)
        except ValueError:
            _fail(key, f"expected a number, got {value!r}")
    if annotation is int:
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or float(value) != int(value)):
            _fail(key, f"expected an integer, got {value!r}")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(key, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            _fail(key, f"expected a finite number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            _fail(key, f"expected a string, got {value!r}")
        return value
    return value


def _build(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    if not isinstance(values, Mapping):
        _fail(prefix.rstrip(".") or "<root>", f"expected a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        _fail(prefix + unknown[0], f"unknown key; valid keys here: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in values.items():
        ann = hints[name]
        if dataclasses.is_dataclass(ann):
            kwargs[name] = _build(ann, value if value is not None else {}, prefix + name + ".")
        elif name == "method" and prefix == "" and isinstance(value, list):
            kwargs[name] = value  # several methods: `raysim run` runs each in turn
        else:
            kwargs[name] = _coerce(prefix + name, value, ann)
    return cls(**kwargs)


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, f"unknown value {value!r}; choose one of {', '.join(choices)}")


def validate(cfg: Config) -> Config:
    """Range checks that do not need the registries (methods and datasets check themselves)."""
    for key in ("rounds", "num_clients", "local_epochs", "batch_size", "eval_batch_size", "eval_every"):
        if getattr(cfg, key) < 1:
            _fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.seed < 0:
        _fail("seed", f"must be >= 0, got {cfg.seed}")
    if cfg.replicate < 0:
        _fail("replicate", f"must be >= 0, got {cfg.replicate}")
    if cfg.clients_per_round is not None and not 1 <= cfg.clients_per_round <= cfg.num_clients:
        _fail("clients_per_round", f"must be in [1, num_clients={cfg.num_clients}] (or null: all clients), "
                                   f"got {cfg.clients_per_round}")
    _choice("participation", cfg.participation, PARTICIPATION_MODES)
    if not cfg.lr > 0:
        _fail("lr", f"must be > 0, got {cfg.lr}")
    d, p, r = cfg.data, cfg.privacy, cfg.runtime
    _choice("model", cfg.model, MODEL_NAMES)
    _choice("data.partition", d.partition, ("iid", "dirichlet", "shards"))
    if not d.alpha > 0:
        _fail("data.alpha", f"must be > 0, got {d.alpha}")
    if not 0 <= d.val_fraction < 1:
        _fail("data.val_fraction", f"must be in [0, 1), got {d.val_fraction}")
    _choice("privacy.clipping", p.clipping, ("auto", *CLIPPING_MODES))
    _choice("privacy.accountant", p.accountant, ("pld", "rdp"))
    if p.epsilon is not None and p.noise_multiplier is not None:
        _fail("privacy.epsilon", "give privacy.epsilon or privacy.noise_multiplier, not both")
    if p.epsilon is not None and not p.epsilon > 0:
        _fail("privacy.epsilon", f"must be > 0, got {p.epsilon}")
    if p.noise_multiplier is not None and not p.noise_multiplier >= 0:
        _fail("privacy.noise_multiplier", f"must be >= 0, got {p.noise_multiplier}")
    if not 0 < p.delta < 1:
        _fail("privacy.delta", f"must be in (0, 1), got {p.delta}")
    if not p.clip_norm > 0:
        _fail("privacy.clip_norm", f"must be > 0, got {p.clip_norm}")
    _choice("runtime.executor", r.executor, ("ray", "serial"))
    _choice("runtime.eval_on", r.eval_on, ("auto", "driver", "actor"))
    if r.num_actors is not None and r.num_actors < 1:
        _fail("runtime.num_actors", f"must be >= 1, got {r.num_actors}")
    if r.num_cpus_per_client is not None and not r.num_cpus_per_client > 0:
        _fail("runtime.num_cpus_per_client", f"must be > 0, got {r.num_cpus_per_client}")
    if r.num_gpus_per_client < 0:
        _fail("runtime.num_gpus_per_client", f"must be >= 0, got {r.num_gpus_per_client}")
    if r.gpu_memory_fraction is not None and not 0 < r.gpu_memory_fraction <= 1:
        _fail("runtime.gpu_memory_fraction", f"must be in (0, 1], got {r.gpu_memory_fraction}")
    if r.checkpoint_every < 0:
        _fail("runtime.checkpoint_every", f"must be >= 0 (0: no checkpoints), got {r.checkpoint_every}")
    if r.torch_threads < 1:
        _fail("runtime.torch_threads", f"must be >= 1, got {r.torch_threads}")
    _choice("adpc.statistic", cfg.adpc.statistic, ADPC_STATISTICS)
    if not 0 < cfg.adpc.quantile < 1:
        _fail("adpc.quantile", f"must be in (0, 1), got {cfg.adpc.quantile}")
    if cfg.adpc.histogram_bins < 1:
        _fail("adpc.histogram_bins", f"must be >= 1, got {cfg.adpc.histogram_bins}")
    if not 0 < cfg.adpc.histogram_min < cfg.adpc.histogram_max:
        _fail("adpc.histogram_min", f"need 0 < adpc.histogram_min < adpc.histogram_max, got "
                                    f"{cfg.adpc.histogram_min}, {cfg.adpc.histogram_max}")
    if not cfg.adpc.histogram_noise_multiplier > 0:
        _fail("adpc.histogram_noise_multiplier", f"must be > 0 (the histogram is a private release), "
                                                 f"got {cfg.adpc.histogram_noise_multiplier}")
    _choice("cra.utility", cfg.cra.utility, ("local_val_f1", "server_val_f1"))
    if d.train_subsample is not None and d.train_subsample < 1:
        _fail("data.train_subsample", f"must be >= 1 (or null: the whole training split), got {d.train_subsample}")
    if d.server_holdout is not None and d.server_holdout < 0:
        _fail("data.server_holdout", f"must be >= 0, got {d.server_holdout}")
    if cfg.cra.utility == "server_val_f1" and d.server_holdout == 0:
        _fail("data.server_holdout", "cra.utility=server_val_f1 scores uploads on the public server hold-out; "
                                     "set data.server_holdout > 0 (e.g. 500) or leave it unset")
    _choice("adpc.read", cfg.adpc.read, ADPC_READS)
    if cfg.adpc.read == "pooled" and cfg.adpc.statistic != "example_norm_median":
        _fail("adpc.read", f"pooled sums the clients' norm histograms, which only adpc.statistic=example_norm_median "
                           f"uploads; got adpc.statistic={cfg.adpc.statistic}")
    _choice("adpc.step", cfg.adpc.step, ADPC_STEPS)
    if not 0 < cfg.adpc.smoothing <= 1:
        _fail("adpc.smoothing", f"must be in (0, 1], got {cfg.adpc.smoothing}")
    if not 0 < cfg.adpc.c_min <= cfg.adpc.c0:
        _fail("adpc.c_min", f"must be in (0, adpc.c0], got {cfg.adpc.c_min}")
    if not 0 <= cfg.cra.beta < 1:
        _fail("cra.beta", f"must be in [0, 1), got {cfg.cra.beta}")
    if not cfg.cra.rho >= 1:
        _fail("cra.rho", f"must be >= 1 (else the ambiguity set can be empty), got {cfg.cra.rho}")
    _choice("sam.mode", cfg.sam.mode, ("previous", "both"))
    if not 0 < cfg.acdn.gamma <= 1:
        _fail("acdn.gamma", f"must be in (0, 1], got {cfg.acdn.gamma}")
    for key, val in (("acdn.momentum", cfg.acdn.momentum), ("awdp.beta", cfg.awdp.beta), ("fedacg.lam", cfg.fedacg.lam)):
        if not 0 <= val < 1:
            _fail(key, f"must be in [0, 1), got {val}")
    for key, val in (("sam.rho", cfg.sam.rho), ("fedacg.beta", cfg.fedacg.beta), ("fedprox.mu", cfg.fedprox.mu),
                     ("quantile.eta_c", cfg.quantile.eta_c), ("quantile.noise_multiplier", cfg.quantile.noise_multiplier)):
        if not val >= 0:
            _fail(key, f"must be >= 0, got {val}")
    if not 0 <= cfg.quantile.target_quantile <= 1:
        _fail("quantile.target_quantile", f"must be in [0, 1], got {cfg.quantile.target_quantile}")
    _choice("quantile.norm_source", cfg.quantile.norm_source, ("per_example", "update"))
    for key, val in (("lldm.reduction", cfg.lldm.reduction), ("lldm.keep_fraction", cfg.lldm.keep_fraction)):
        if not 0 < val <= 1:
            _fail(key, f"must be in (0, 1], got {val}")
    return cfg


def config_from_dict(values: Mapping[str, Any]) -> Config:
    return validate(_build(Config, values))


def parse_override(text: str) -> tuple[str, Any]:
    """``key.sub=value`` with the value parsed as YAML (``8`` → 8, ``null`` → None, ``[a, b]`` → list)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}: {exc}") from None
    return key, value


def cli_overrides(overrides: list[str] | tuple[str, ...], data_root: str | None = None,
                  address: str | None = None) -> list[tuple[str, Any]]:
    """``--set`` pairs plus the ``--data-root`` / ``--address`` shortcuts, in that order."""
    import os
    pairs = [parse_override(o) for o in overrides]
    if data_root is not None:
        pairs.append(("data.root", os.path.abspath(data_root)))
    if address is not None:
        pairs.append(("runtime.address", address))
    return pairs


def apply_overrides(values: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Return a deep copy of ``values`` with dotted-key overrides applied."""
    out = json.loads(json.dumps(values))
    for key, value in overrides:
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: '{part}' is not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return values


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    values = read_yaml(path)
    values = apply_overrides(values, [parse_override(o) for o in overrides or []])
    return config_from_dict(values)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_hash(cfg: Config) -> str:
    """Stable hash of the resolved config (key order and float formatting independent)."""
    return _hash_dict(config_to_dict(cfg))


def _hash_dict(values: dict[str, Any]) -> str:
    blob = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def server_holdout_size(cfg: Config) -> int:
    """Training images removed before partitioning for the public server hold-out (``data.server_holdout``)."""
    if cfg.data.server_holdout is not None:
        return int(cfg.data.server_holdout)
    return 500 if cfg.cra.utility == "server_val_f1" else 0


_RUNTIME_KEYS_ADDED_LATER = ("eval_on", "malloc_tuning")
#: ADPC keys added later, with the value that reproduces the behaviour from before they existed.
_ADPC_KEYS_ADDED_LATER = {"read": "per_client", "step": "coupled"}


def _adpc_runs(cfg: Config) -> bool:
    """Whether ADPC runs (FedDimDP or one of its presets with the switch on): only then do its keys
    added later enter the run id, so no other method's run id moves with their defaults."""
    family = cfg.method == "feddimdp" or cfg.method.startswith("feddimdp-")
    return family and cfg.method != "feddimdp-no-adpc" and cfg.feddimdp.on("adpc")


def result_hash(cfg: Config) -> str:
    """Hash of the result-relevant config. Where and how fast a run executes does not change its
    results (the determinism test), so the runtime section and data paths are not part of it."""
    d = dataclasses.replace(cfg.data, root=None, cache_dir=None, download=False)
    values = config_to_dict(cfg.replace(runtime=RuntimeConfig(), data=d))
    # Runtime keys added later are left out of the (defaulted) runtime section: run ids stay those of
    # results written before the keys existed.
    for key in _RUNTIME_KEYS_ADDED_LATER:
        del values["runtime"][key]
    for key, legacy in _ADPC_KEYS_ADDED_LATER.items():
        # The earlier behaviour, or no ADPC at all: the run id the config had before the key existed.
        if values["adpc"][key] == legacy or not _adpc_runs(cfg):
            del values["adpc"][key]
    if cfg.clients_per_round is None:
        # Full participation: `participation` changes nothing, and leaving both keys out keeps the run ids
        # of results written before the keys existed (their runs resume into the same rows).
        del values["clients_per_round"], values["participation"]
    if cfg.data.train_subsample is None:
        del values["data"]["train_subsample"]   # the whole training split: the run id it had before the key existed
    if cfg.replicate == 0:
        del values["replicate"]        # the default: a federation's first replicate keeps its run id
    if cfg.eval_every == 1:
        del values["eval_every"]       # the default: run ids of results written before the key existed stay the same
    if cfg.model == "cnn":
        del values["model"]            # likewise for the default backbone
    return _hash_dict(values)


def run_id_for(cfg: Config) -> str:
    """A run's stable id: readable prefix + hash of the result-relevant config."""
    return f"{cfg.method}-{cfg.data.name}-s{cfg.seed}-{result_hash(cfg)[:10]}"
