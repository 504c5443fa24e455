"""Reading and validating a tune file (the format: :mod:`raysim.tune`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from raysim.config import ConfigError, apply_overrides, cli_overrides, read_yaml
from raysim.sweep import file_base
from raysim.tune.plan import candidates, config_for
from raysim.tune.spec import _KEYS, OBJECTIVES, PRIVACY_NEUTRAL_KEYS, Candidate, Contestant, TuneSpec

def _flatten(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, Mapping) and not _is_range(value):
            out.extend(_flatten(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _is_range(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and set(value) <= {"log", "linear", "num"}


def _check_space_entry(where: str, key: str, value: Any, search: str) -> None:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"tune {where} '{key}': expected a non-empty list of values")
        return
    if _is_range(value):
        kind = "log" if "log" in value else "linear"
        bounds = value.get(kind)
        if ("log" in value) == ("linear" in value) or not isinstance(bounds, list) or len(bounds) != 2:
            raise ConfigError(f"tune {where} '{key}': expected {{log: [lo, hi], num: n}} or {{linear: [lo, hi], num: n}}")
        lo, hi = (float(b) for b in bounds)
        if not lo < hi or (kind == "log" and lo <= 0):
            raise ConfigError(f"tune {where} '{key}': need {'0 < ' if kind == 'log' else ''}lo < hi, got {bounds}")
        num = value.get("num")
        if search == "grid" and (not isinstance(num, int) or num < 2):
            raise ConfigError(f"tune {where} '{key}': a grid search needs num >= 2 points")
        return
    raise ConfigError(f"tune {where} '{key}': expected a list of values or {{log: [lo, hi], num: n}}, got {value!r}")


def _seeds(raw: Any, key: str, required: bool) -> tuple[int, ...]:
    if raw is None and not required:
        return ()
    if (not isinstance(raw, list) or not raw
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in raw)):
        raise ConfigError(f"tune key '{key}': expected a non-empty list of seeds (integers >= 0), got {raw!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"tune key '{key}': a seed is listed twice")
    return tuple(raw)


def _contestants(raw: Any) -> tuple[Contestant, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("tune key 'methods': expected a non-empty list of method names or {label, method, set}")
    out = []
    for entry in raw:
        if isinstance(entry, str):
            out.append(Contestant(entry, entry))
            continue
        if not isinstance(entry, Mapping) or "method" not in entry or set(entry) - {"label", "method", "set"}:
            raise ConfigError(f"tune methods entry {entry!r}: expected a method name or {{label, method, set}}")
        sets = entry.get("set") or {}
        if not isinstance(sets, Mapping):
            raise ConfigError(f"tune methods entry {entry!r}: `set` must be a mapping of dotted keys")
        out.append(Contestant(str(entry.get("label") or entry["method"]), str(entry["method"]), tuple(_flatten(sets))))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"tune key 'methods': two contestants share a label ({labels}); give each a `label`")
    return tuple(out)


def parse_tune(spec: Mapping[str, Any], *, name: str, base_dir: Path = Path("."),
               overrides: Sequence[tuple[str, Any]] = ()) -> TuneSpec:
    """Validate a parsed tune file (``overrides``: ``--set`` pairs, applied to the base after ``set``)."""
    base = file_base(spec, "tune", _KEYS, base_dir)
    sets = spec.get("set") or {}
    if not isinstance(sets, Mapping):
        raise ConfigError("tune key 'set': expected a mapping of dotted config keys")
    values = apply_overrides(dict(base), _flatten(sets) + list(overrides))
    values.pop("method", None)   # the contestants name the methods
    values.pop("seed", None)     # the stages name the seeds
    contestants = _contestants(spec.get("methods"))
    search = spec.get("search", "grid")
    if search not in ("grid", "random"):
        raise ConfigError(f"tune key 'search': unknown value {search!r}; choose one of grid, random")
    budget = spec.get("budget")
    if search == "random" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError("tune key 'budget': a random search needs budget >= 1 candidates per contestant")
    if search == "grid" and budget is not None:
        raise ConfigError("tune key 'budget': only a random search takes a budget")
    space = spec.get("space") or {}
    if not isinstance(space, Mapping):
        raise ConfigError("tune key 'space': expected a mapping of dotted keys to values")
    common = _flatten(space)
    per = spec.get("method_space") or {}
    if not isinstance(per, Mapping) or set(per) - {c.label for c in contestants}:
        raise ConfigError(f"tune key 'method_space': expected contestant labels as keys "
                          f"({', '.join(c.label for c in contestants)})")
    spaces = {}
    for c in contestants:
        entries = dict(common)
        entries.update(_flatten(per.get(c.label) or {}))
        for key, value in entries.items():
            _check_space_entry("space", key, value, search)
        spaces[c.label] = tuple(entries.items())
    private = spec.get("private", False)
    if not isinstance(private, bool):
        raise ConfigError(f"tune key 'private': expected true/false, got {private!r}")
    tuning_seeds = _seeds(spec.get("tuning_seeds"), "tuning_seeds", required=not private)
    final_seeds = _seeds(spec.get("final_seeds"), "final_seeds", required=True)
    shared = sorted(set(tuning_seeds) & set(final_seeds))
    if shared:
        raise ConfigError(f"tune keys 'tuning_seeds' and 'final_seeds' must be disjoint; both list {shared}")
    objective = spec.get("objective", "accuracy")
    if objective not in OBJECTIVES:
        raise ConfigError(f"tune key 'objective': unknown value {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    reference = spec.get("reference")
    if reference is not None and reference not in {c.label for c in contestants}:
        raise ConfigError(f"tune key 'reference': {reference!r} is not one of the contestants")
    count = None
    if private:
        from raysim.privacy.tuning import CandidateCount
        raw = spec.get("candidates") or {}
        if not isinstance(raw, Mapping):
            raise ConfigError("tune key 'candidates': expected {distribution: ..., ...}")
        try:
            count = CandidateCount.from_mapping(raw, prefix="tune.candidates.")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for label, entries in spaces.items():
            odd = sorted(k for k, _ in entries if k not in PRIVACY_NEUTRAL_KEYS)
            if odd:
                raise ConfigError(f"tune: private tuning searches only keys that leave the privacy plan unchanged "
                                  f"({', '.join(PRIVACY_NEUTRAL_KEYS)}), so that every candidate has the same RDP "
                                  f"curve; contestant {label} searches {odd[0]}")
    elif spec.get("candidates") is not None:
        raise ConfigError("tune key 'candidates': the candidate-count distribution applies with private: true only")
    seed = spec.get("search_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"tune key 'search_seed': expected an integer >= 0, got {seed!r}")
    from raysim.tune.select import SELECTIONS
    selection = spec.get("selection", "one_se")
    if selection not in SELECTIONS:
        raise ConfigError(f"tune key 'selection': unknown value {selection!r}; choose one of {', '.join(SELECTIONS)}")
    tune = TuneSpec(str(spec.get("name") or name), values, contestants, spaces, search, budget, seed,
                    tuning_seeds, final_seeds, objective, reference, private, count, selection)
    from raysim.run_plan import plan_run
    for c in contestants:   # the base config and a candidate of every contestant must be valid before anything runs
        cfg = config_for(tune, c, Candidate(()), final_seeds[0])
        try:
            cfg = plan_run(cfg).cfg
        except ValueError as exc:
            raise ConfigError(f"tune contestant {c.label}: {exc}") from None
        if private and cfg.privacy.unit == "client":
            from raysim.privacy.population import keeps_rdp_curve
            if not keeps_rdp_curve(cfg):
                raise ConfigError(f"tune contestant {c.label}: private tuning composes each run's RDP curve, and "
                                  f"privacy.unit=client keeps one only for privacy.mechanism=gaussian with Poisson "
                                  f"or full cohorts; this one has privacy.mechanism={cfg.privacy.mechanism} and "
                                  f"participation={cfg.participation}: set privacy.mechanism=gaussian and "
                                  f"participation=poisson")
        config_for(tune, c, candidates(tune, c)[0], final_seeds[0])
        if not cfg.data.server_holdout:
            raise ConfigError("tune: the validation set is the public server hold-out; set data.server_holdout > 0 "
                              "in the base or under `set` (e.g. 200 images)")
    return tune


def load_tune(path: str | Path, overrides: Sequence[str] = (), data_root: str | None = None,
              address: str | None = None) -> TuneSpec:
    p = Path(path)
    return parse_tune(read_yaml(p), name=p.stem, base_dir=p.parent,
                      overrides=cli_overrides(tuple(overrides), data_root, address))
