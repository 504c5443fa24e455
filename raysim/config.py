"""Frozen, validated configuration.

YAML (or a dict) in, a tree of frozen dataclasses out. The generic keys (rounds, clients, data,
privacy, runtime) are fields here; each method owns its section (``adpc``, ``cra``, ...), a frozen
dataclass it declares in its own module (``MethodSpec.params``) and the registry registers here, so
a section is parsed and checked like every other key. An unknown key, a wrong type or an
out-of-range value raises ``ConfigError`` (a ``ValueError``) with a one-line message naming the key.
Keys marked *(R)* are reconstructions of choices the FedDimDP paper does not state (docs/methods.md).
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
from typing import Any, Callable, Collection, Mapping

import yaml

__all__ = ["ConfigError", "Config", "register_section", "method_sections", "fail", "check_choice", "load_config", "config_from_dict", "apply_overrides", "config_to_dict",
           "config_hash", "parse_override", "result_hash", "CLIPPING_MODES", "PARTICIPATION_MODES",
           "MODEL_NAMES", "PRIVACY_UNITS", "DEFAULT_MECHANISM", "add_mechanism",
           "remove_mechanism", "client_mechanism", "client_mechanisms"]

#: ``participation`` modes (R): how a round's clients are drawn when ``clients_per_round`` is set
#: (``shuffle``: consecutive cohorts of one shuffled pass over the population after another).
PARTICIPATION_MODES = ("uniform", "poisson", "shuffle")

#: ``privacy.unit``: what a run's ε protects.
PRIVACY_UNITS = ("example", "client")
#: ``privacy.mechanism``'s default: independent Gaussian noise (DP-SGD's under ``privacy.unit=example``).
#: It names a registered mechanism object, which the checks below ask what it accepts.
DEFAULT_MECHANISM = "gaussian"
#: The client-level mechanisms by name, built-in and from outside: ``raysim.privacy.mechanisms.registry``
#: adds each (``add_mechanism``); this module imports none of them, and knows only what they declare.
_MECHANISMS: dict[str, Any] = {}

#: ``privacy.clipping`` modes once resolved (``auto`` resolves to one of them).
CLIPPING_MODES = ("per_sample", "batch", "none")
#: The resolved clipping of ``privacy.unit=client``: local training without DP, each client's whole update
#: clipped to C, the server's noise on the cohort sum.
UPDATE_CLIPPING = "update"
#: Backbones of the top-level ``model`` key, built by ``raysim.models.model_for``; a model registered from
#: outside (``raysim.models.register_model``) is added to the ``model`` choices by ``add_choice``.
MODEL_NAMES = ("cnn", "small_cnn", "resnet18_gn", "wrn16_4", "leaf_cnn", "char_lstm")
#: The built-in models that read token sequences (data sets of kind ``tokens``); the others read images.
SEQUENCE_MODELS = ("char_lstm",)
_EXTRA_CHOICES: dict[str, list[str]] = {}


def add_choice(key: str, name: str) -> None:
    """Accept ``name`` for the config key ``key`` (a registry that takes names from outside calls it)."""
    names = _EXTRA_CHOICES.setdefault(key, [])
    if name not in names:
        names.append(name)


def add_mechanism(mechanism: Any) -> None:
    """Accept ``mechanism.name`` for ``privacy.mechanism`` (called by the mechanism registry)."""
    _MECHANISMS[mechanism.name] = mechanism


def remove_mechanism(name: str) -> None:
    _MECHANISMS.pop(name, None)


def client_mechanism(name: str) -> Any:
    """The registered client-level mechanism ``name`` (a ``ClientMechanism``); KeyError if none."""
    return _MECHANISMS[name]


def client_mechanisms() -> tuple[Any, ...]:
    """Every registered client-level mechanism, in the order of registration (the built-in ones first)."""
    return tuple(_MECHANISMS.values())


class ConfigError(ValueError):
    """A configuration a user wrote is invalid."""


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    root: str | None = None            # --data-root; where cifar10/, svhn/, stl10/ and LEAF's femnist/ live
    download: bool = False             # only then may torchvision download
    cache_dir: str | None = None       # decoded-array cache; default ~/.cache/raysim
    partition: str = "dirichlet"       # iid | dirichlet | shards | natural (one client per natural user)
    alpha: float = 0.3                 # Dirichlet concentration
    min_samples_per_client: int = 10
    shards_per_client: int = 2         # (R) SVHN class-grouped partition
    shard_size_sigma: float = 1.0      # (R) log-normal quantity skew of the shards partitioner
    val_fraction: float = 0.1          # (R) local validation split for CRA's q_i
    train_subsample: int | None = None  # keep a fixed subset of this many training images, the same for every
                                        # seed (stream (0, "train-subsample")): a smaller data set for quick studies
    max_samples_per_user: int | None = None  # natural partition: keep a fixed subset of at most this many of each
                                       # user's training samples, the same for every seed (None = all)
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
    unit: str = "example"              # what ε protects: example (one training example of one client, DP-SGD) |
                                       # client (one whole client, DP-FedAvg: each update clipped, noised once)
    mechanism: str = DEFAULT_MECHANISM  # client unit: gaussian (noised cohort sum, sampled cohorts) | tree (DP-FTRL) |
                                       # blt (Buffered Linear Toeplitz) | bandmf (banded matrix factorisation);
                                       # example unit (each client's DP-SGD steps): gaussian | bandmf
    min_separation: int | None = None  # blt, bandmf: G cyclic groups of clients, round t draws from group (t - 1) mod G
                                       # (BandMF's bands); None: min(N // k, rounds). Example unit, bandmf
                                       # (required): the bands b over each client's steps (at most b, a divisor of
                                       # its steps a round)
    workload_decay: float = 0.0        # bandmf: η of the workload its strategy is optimised for, the model after
                                       # w_t = (1 − η) w_{t−1} + x_t (0: prefix sums; docs/privacy.md)
    noise_cohort_size: int | None = None   # client unit: k' of a deployment the noise is sized for (with
    population_size: int | None = None     # population_size N'); ε is then the deployment's
    allow_uncovered: tuple[str, ...] = ()  # uploads computed from private data without noise that the run
                                           # may make, by name (e.g. [cra.local_val_f1]); any other is refused


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
    eval_on: str = "auto"              # where the global model is evaluated: driver | actor (the client actors,
                                       # on their GPU shares if they have them) | auto (actor when clients have
                                       # GPUs, and on CPUs after the last round; else the driver)
    malloc_tuning: bool = True         # keep multi-MB buffers in the heap (raysim.allocator); speed only
    head_start: bool = True            # a run (or a sweep's first run) that starts its own local Ray trains its
                                       # first clients in the launching process until the actors are warm
                                       # (raysim.runtime.head_start);
                                       # speed only
    sum_on_actors: bool = False        # each actor returns the weighted sum of its clients' updates instead of
                                       # each update (methods whose server reads only that sum: FedAvg's rule);
                                       # the weights stay within a float32 rounding of the per-update sum's,
                                       # not bit for bit; runs wait for Ray (no head start) (docs/cluster.md)


# --------------------------------------------------------------------------- method sections

#: Config sections owned by methods (``adpc``, ``cra``, ...): section name -> frozen dataclass, registered
#: by the method registry (``raysim.algorithms.registry.register``) from each ``MethodSpec.params``. This
#: module knows only that sections exist; ``_SECTION_LOADERS`` (installed by the registry) discover the
#: methods before a section is looked up.
_SECTIONS: dict[str, type] = {}
_SECTION_LOADERS: list[Callable[[], None]] = []


def register_section(name: str, cls: type) -> None:
    """Make ``name`` a config section parsed into the frozen dataclass ``cls`` (its ``check(cfg)``, if
    any, validates a parsed config). A section registered twice must be the same class."""
    if name in _GENERIC_KEYS:
        raise ValueError(f"config section {name!r} would shadow a generic config key")
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):   # type: ignore[attr-defined]
        raise ValueError(f"config section {name!r}: {cls!r} is not a frozen dataclass")
    if _SECTIONS.get(name, cls) is not cls:
        raise ValueError(f"config section {name!r} is already registered with {_SECTIONS[name]!r}")
    _SECTIONS[name] = cls


def unregister_section(name: str) -> None:
    _SECTIONS.pop(name, None)


def add_section_loader(loader: Callable[[], None]) -> None:
    """``loader()`` registers sections (idempotent); it runs before sections are looked up."""
    if loader not in _SECTION_LOADERS:
        _SECTION_LOADERS.append(loader)


def method_sections() -> dict[str, type]:
    """Every registered method section, by name (the registry's methods discovered first)."""
    for loader in _SECTION_LOADERS:
        loader()
    return dict(_SECTIONS)


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
    plugins: tuple[str, ...] = ()      # modules to import before names are resolved (raysim/plugins.py)
    data: DataConfig = field(default_factory=DataConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    #: the method sections (``adpc``, ``cra``, ...), as (name, frozen dataclass) pairs sorted by name: every
    #: registered section, at its defaults unless set; read them as attributes (``cfg.adpc.c0``)
    sections: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        known = method_sections()
        given = dict(self.sections)
        for name in sorted(given):
            if name not in known:
                _fail(name, f"unknown method section; sections: {', '.join(sorted(known))}")
        full = {name: given[name] if name in given else cls() for name, cls in known.items()}
        object.__setattr__(self, "sections", tuple(sorted(full.items())))

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: a method section by name
        if name.startswith("__"):
            raise AttributeError(name)
        for key, value in self.__dict__.get("sections", ()):
            if key == name:
                return value
        raise AttributeError(f"Config has no key or method section {name!r}")

    def replace(self, **changes: Any) -> "Config":
        """A copy with generic keys and/or whole method sections replaced."""
        names = {f.name for f in dataclasses.fields(self)}
        sections = {k: v for k, v in changes.items() if k not in names}
        generic = {k: v for k, v in changes.items() if k in names}
        if sections:
            unknown = sorted(set(sections) - set(method_sections()))
            if unknown:
                raise TypeError(f"Config has no key or method section {unknown[0]!r}")
            generic["sections"] = tuple(sorted({**dict(generic.get("sections", self.sections)), **sections}.items()))
        return dataclasses.replace(self, **generic)

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


#: The generic top-level keys (a method section may not take one of these names).
_GENERIC_KEYS = frozenset(f.name for f in dataclasses.fields(Config))


# --------------------------------------------------------------------------- building

#: The noise multipliers the accountants evaluate and the σ search explores; outside it a request is
#: almost surely a mistake (and the accountants' floating-point arithmetic overflows).
NOISE_MULTIPLIER_RANGE = (1e-4, 1e6)


def _fail(key: str, msg: str) -> typing.NoReturn:
    raise ConfigError(f"config key '{key}': {msg}")


def fail(key: str, msg: str) -> typing.NoReturn:
    """Raise the one-line ``ConfigError`` for a bad value of ``key`` (for method sections' ``check``)."""
    _fail(key, msg)


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
    if typing.get_origin(annotation) is tuple and typing.get_args(annotation) == (str, ...):
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            _fail(key, f"expected a list of names, got {value!r}")
        return tuple(items)
    if annotation is str:
        if not isinstance(value, str):
            _fail(key, f"expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            _fail(key, f"expected a list, got {value!r}")
        return tuple(_coerce(key, v, typing.get_args(annotation)[0]) for v in value)
    return value


def _build(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    if not isinstance(values, Mapping):
        _fail(prefix.rstrip(".") or "<root>", f"expected a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    sections = method_sections() if cls is Config else {}
    names.discard("sections") if cls is Config else None
    unknown = sorted(set(values) - names - set(sections))
    if unknown:
        _fail(prefix + unknown[0], f"unknown key; valid keys here: {', '.join(sorted(names | set(sections)))}")
    kwargs: dict[str, Any] = {}
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        if name in sections:
            parsed[name] = _build(sections[name], value if value is not None else {}, name + ".")
            continue
        ann = hints[name]
        if dataclasses.is_dataclass(ann):
            kwargs[name] = _build(ann, value if value is not None else {}, prefix + name + ".")
        elif name == "method" and prefix == "" and isinstance(value, list):
            kwargs[name] = value  # several methods: `raysim run` runs each in turn
        else:
            kwargs[name] = _coerce(prefix + name, value, ann)
    if parsed:
        kwargs["sections"] = tuple(sorted(parsed.items()))
    return cls(**kwargs)


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    choices = (*choices, *_EXTRA_CHOICES.get(key, ()))
    if value not in choices:
        _fail(key, f"unknown value {value!r}; choose one of {', '.join(choices)}")


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """``ConfigError`` unless ``value`` is one of ``choices`` (for method sections' ``check``)."""
    _choice(key, value, choices)


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
    if not 0 <= cfg.momentum < 1:   # heavy-ball momentum diverges at 1 and above
        _fail("momentum", f"must be in [0, 1), got {cfg.momentum}")
    d, p, r = cfg.data, cfg.privacy, cfg.runtime
    _choice("model", cfg.model, MODEL_NAMES)
    _choice("data.partition", d.partition, ("iid", "dirichlet", "shards", "natural"))
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
    low, high = NOISE_MULTIPLIER_RANGE
    if p.noise_multiplier is not None and not (p.noise_multiplier == 0 or low <= p.noise_multiplier <= high):
        _fail("privacy.noise_multiplier", f"must be 0 (no noise) or in [{low:g}, {high:g}], got {p.noise_multiplier}")
    if not 0 < p.delta < 1:
        _fail("privacy.delta", f"must be in (0, 1), got {p.delta}")
    if not p.clip_norm > 0:
        _fail("privacy.clip_norm", f"must be > 0, got {p.clip_norm}")
    _check_unit(cfg)
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
    if d.max_samples_per_user is not None and d.max_samples_per_user < 1:
        _fail("data.max_samples_per_user", f"must be >= 1 (or null: every sample), got {d.max_samples_per_user}")
    if d.max_samples_per_user is not None and d.partition != "natural":
        _fail("data.max_samples_per_user", "applies to data.partition: natural only (use data.train_subsample)")
    if d.train_subsample is not None and d.train_subsample < 1:
        _fail("data.train_subsample", f"must be >= 1 (or null: the whole training split), got {d.train_subsample}")
    if d.test_subsample is not None and d.test_subsample < 1:   # 0 would score every round on no image
        _fail("data.test_subsample", f"must be >= 1 (or null: the whole test split), got {d.test_subsample}")
    if d.server_holdout is not None and d.server_holdout < 0:
        _fail("data.server_holdout", f"must be >= 0, got {d.server_holdout}")
    for _, section in cfg.sections:          # each method section checks itself (and what it needs of cfg)
        check = getattr(section, "check", None)
        if check is not None:
            check(cfg)
    return cfg


def _check_unit(cfg: Config) -> None:
    """The client-unit keys: only under ``privacy.unit=client``, and consistent with the cohorts. The
    registered mechanism object says what it accepts."""
    p = cfg.privacy
    _choice("privacy.unit", p.unit, PRIVACY_UNITS)
    _choice("privacy.mechanism", p.mechanism, tuple(_MECHANISMS))
    mech = client_mechanism(p.mechanism)
    deployment = (p.noise_cohort_size, p.population_size)
    if p.min_separation is not None and not mech.cyclic:
        cyclic = "|".join(m.name for m in client_mechanisms() if m.cyclic)
        _fail("privacy.min_separation", f"sets the cyclic groups of privacy.mechanism={cyclic}; "
                                        f"this run's mechanism is {p.mechanism}")
    if p.workload_decay != 0.0:
        if not mech.damped_workload:
            damped = "|".join(m.name for m in client_mechanisms() if m.damped_workload)
            _fail("privacy.workload_decay", f"shapes the strategy of privacy.mechanism={damped}; this run's mechanism "
                                            f"is {p.mechanism}")
        if not 0.0 <= p.workload_decay < 1.0:
            _fail("privacy.workload_decay", f"must be in [0, 1), got {p.workload_decay}")
    if p.unit == "example":
        if not mech.example_unit:
            steps = "|".join(m.name for m in client_mechanisms() if m.example_unit)
            _fail("privacy.mechanism", f"{p.mechanism} needs privacy.unit=client (it protects whole clients); the "
                                       f"noise of DP-SGD steps is privacy.mechanism={steps}")
        if mech.correlated and p.min_separation is None:
            _fail("privacy.min_separation", f"privacy.mechanism={p.mechanism} under privacy.unit=example needs its "
                                            f"bands b: each client's examples are cut into b groups and step s "
                                            f"draws from group s mod b (e.g. privacy.min_separation=4)")
        if p.min_separation is not None and p.min_separation < 1:
            _fail("privacy.min_separation", f"must be >= 1, got {p.min_separation}")
        for key, value in zip(("noise_cohort_size", "population_size"), deployment):
            if value is not None:
                _fail(f"privacy.{key}", "sizes the noise of a client-level deployment; it needs privacy.unit=client")
        if cfg.participation == "shuffle":
            _fail("participation", "shuffle is DP-FTRL's cohort order; it needs privacy.unit=client and "
                                   "privacy.mechanism=tree")
        return
    if (p.noise_cohort_size is None) != (p.population_size is None):
        _fail("privacy.noise_cohort_size", "give privacy.noise_cohort_size and privacy.population_size together")
    if p.noise_cohort_size is not None:
        if not 1 <= p.noise_cohort_size <= p.population_size:
            _fail("privacy.noise_cohort_size", f"must be in [1, privacy.population_size={p.population_size}], "
                                               f"got {p.noise_cohort_size}")
        if p.population_size < cfg.num_clients:
            _fail("privacy.population_size", f"the deployment must be at least the simulated federation "
                                             f"(num_clients={cfg.num_clients}), got {p.population_size}")
        if not mech.deployment:
            sized = "|".join(m.name for m in client_mechanisms() if m.deployment)
            _fail("privacy.noise_cohort_size", f"noise sized for a deployment is for privacy.mechanism={sized}")
    if mech.cyclic:
        _check_cyclic(cfg, mech)
    elif cfg.participation not in mech.participation:
        _fail("participation", mech.participation_advice)
    if p.clipping not in ("auto",):
        _fail("privacy.clipping", f"privacy.unit=client clips each client's whole update to privacy.clip_norm; "
                                  f"leave privacy.clipping at auto, got {p.clipping}")
    fixed_size = cfg.participation == "uniform" and (cfg.clients_per_round is not None or p.noise_cohort_size is not None)
    if (mech.rdp_only or fixed_size) and p.accountant != "rdp":
        what = mech.accounted_as if mech.rdp_only else "fixed-size cohorts (sampling without replacement)"
        _fail("privacy.accountant", f"privacy.unit=client with {what} is accounted by dp-accounting's RDP accountant "
                                    f"only: set privacy.accountant=rdp (or participation=poisson)")


def _check_cyclic(cfg: Config, mech: Any) -> None:
    """A mechanism on cyclic groups (blt, bandmf): its draws within a group (``mech.participation``, when
    ``clients_per_round`` is set), at most N // k groups (a group's rate is kG/N ≤ 1)."""
    p = cfg.privacy
    if cfg.clients_per_round is not None and cfg.participation not in mech.participation:
        _fail("participation", mech.participation_advice)
    k = cfg.clients_per_round if cfg.clients_per_round is not None else cfg.num_clients
    if p.min_separation is not None and not 1 <= p.min_separation <= cfg.num_clients // k:
        _fail("privacy.min_separation", f"must be in [1, num_clients // clients_per_round = {cfg.num_clients // k}] "
                                        f"(each group is drawn at rate k·G/N ≤ 1), got {p.min_separation}")


def config_from_dict(values: Mapping[str, Any]) -> Config:
    from raysim import plugins   # the config's plugins register their methods, data sets and models first
    named = values.get("plugins") if isinstance(values, Mapping) else None
    plugins.load(named if isinstance(named, (list, tuple)) else ())
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


_MISSING: Any = object()


def dotted_get(tree: Any, key: str, default: Any = _MISSING) -> Any:
    """The value at the dotted ``key`` (``privacy.clip_norm``) of nested mappings or attributes (raw config
    values, or a ``Config`` whose method sections are attributes too); ``default`` if a part is missing
    (``KeyError`` without one). The one dotted-key reader of the project."""
    node = tree
    for part in key.split("."):
        if isinstance(node, Mapping):
            found = node.get(part, _MISSING)
        else:
            found = getattr(node, part, _MISSING)
        if found is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        node = found
    return node


def dotted_set(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` in nested dicts, creating sections as needed (the one dotted-key writer)."""
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
        node = nxt
    node[parts[-1]] = value


def apply_overrides(values: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Return a deep copy of ``values`` with dotted-key overrides applied."""
    out = json.loads(json.dumps(values))
    for key, value in overrides:
        dotted_set(out, key, value)
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
    """The config as plain values; method sections appear as top-level keys, as they are written."""
    if not isinstance(cfg, Config):
        return dataclasses.asdict(cfg)
    out = {f.name: dataclasses.asdict(getattr(cfg, f.name)) if dataclasses.is_dataclass(getattr(cfg, f.name))
           else getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "sections"}
    out.update({name: dataclasses.asdict(section) for name, section in cfg.sections})
    return out


def config_hash(cfg: Config) -> str:
    """Stable hash of the resolved config (key order and float formatting independent)."""
    return _hash_dict(config_to_dict(cfg))


def _hash_dict(values: dict[str, Any]) -> str:
    blob = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def server_holdout_size(cfg: Config) -> int:
    """Training images removed before partitioning for the public server hold-out (``data.server_holdout``;
    unset: the largest ``holdout_default()`` any method section asks for, else 0)."""
    if cfg.data.server_holdout is not None:
        return int(cfg.data.server_holdout)
    wanted = [int(section.holdout_default()) for _, section in cfg.sections if hasattr(section, "holdout_default")]
    return max(wanted, default=0)


#: Privacy and data keys that enter a run's id only when set away from their default, so the ids of configs
#: that do not use them stay what they were before the keys existed.
_HASHED_UNLESS_DEFAULT = (("unit", "example"), ("mechanism", DEFAULT_MECHANISM), ("noise_cohort_size", None),
                          ("population_size", None), ("min_separation", None), ("workload_decay", 0.0))
_DATA_HASHED_UNLESS_DEFAULT = (("max_samples_per_user", None),)

#: Runtime keys that change a run's results: the thread count moves sums in the last place (MKL splits
#: small matmuls by it), and so does summing the updates on the actors (``sum_on_actors``, hashed only when
#: on); every other runtime key only says where and how fast the run executes.
RESULT_RUNTIME_KEYS = ("torch_threads", "sum_on_actors")


def result_hash(cfg: Config, sections: Collection[str] | None = None) -> str:
    """Hash of every config key that changes results: the generic keys, the hold-out size as resolved,
    ``runtime.torch_threads`` and the method sections in ``sections`` (None: every section). Where and how
    fast a run executes does not change its results (the determinism test), so the other runtime keys and the
    data paths are not part of it. A run's id (:func:`raysim.run_plan.run_id_for`) hashes its config with
    its method's presets applied and only the sections the run uses."""
    d = dataclasses.replace(cfg.data, root=None, cache_dir=None, download=False, server_holdout=server_holdout_size(cfg))
    values = config_to_dict(cfg.replace(data=d))
    values["runtime"] = {key: values["runtime"][key] for key in RESULT_RUNTIME_KEYS}
    if not values["runtime"]["sum_on_actors"]:
        del values["runtime"]["sum_on_actors"]
    for key, default in _HASHED_UNLESS_DEFAULT:
        if values["privacy"].get(key) == default:
            del values["privacy"][key]
    for key, default in _DATA_HASHED_UNLESS_DEFAULT:
        if values["data"].get(key) == default:
            del values["data"][key]
    del values["plugins"]   # where the code comes from; the names it registers are in the config
    values["privacy"].pop("allow_uncovered", None)   # permits a release, changes no result
    if sections is not None:
        for name, _ in cfg.sections:
            if name not in sections:
                del values[name]
    return _hash_dict(values)
