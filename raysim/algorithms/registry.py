"""Name → method registry (refuses duplicates, like Opacus' accountant registry)."""

from __future__ import annotations

from raysim.algorithms.base import MethodSpec

_METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.name in _METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    _METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    _load_builtin()
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def method_names() -> list[str]:
    _load_builtin()
    return sorted(_METHODS)


def all_methods() -> list[MethodSpec]:
    _load_builtin()
    return [_METHODS[n] for n in sorted(_METHODS)]


def _load_builtin() -> None:
    # Importing the method modules registers them; done lazily so importing the registry is cheap.
    from raysim.algorithms import builtin  # noqa: F401
