"""The client-level mechanisms by name: ``privacy.mechanism`` is one of :func:`mechanism_names`.

The built-in ones (:mod:`~raysim.privacy.mechanisms.builtin`) are registered when this module is imported;
a mechanism from outside raysim registers itself when its module is imported (the config's ``plugins``
key names such modules)::

    from raysim.privacy.mechanisms.base import ClientMechanism
    from raysim.privacy.mechanisms.registry import register_mechanism

    class HalfNoise(ClientMechanism): ...
    register_mechanism(HalfNoise())

Light: no torch, so that :mod:`raysim.config` can validate against it.
"""

from __future__ import annotations

from raysim.privacy.mechanisms.base import ClientMechanism
from raysim.privacy.mechanisms.builtin import BUILTIN

__all__ = ["register_mechanism", "unregister_mechanism", "get_mechanism", "mechanism_names", "mechanisms",
           "ClientMechanism"]

_REGISTRY: dict[str, ClientMechanism] = {}


def register_mechanism(mechanism: ClientMechanism) -> ClientMechanism:
    """Make ``privacy.mechanism: <mechanism.name>`` (under ``privacy.unit: client``) run ``mechanism``.
    Refuses a taken or empty name."""
    if not isinstance(mechanism, ClientMechanism):
        raise TypeError(f"a client-level mechanism is a ClientMechanism, got {type(mechanism).__name__}")
    if not mechanism.name:
        raise ValueError("a client-level mechanism needs a name")
    if mechanism.name in _REGISTRY:
        raise ValueError(f"privacy.mechanism {mechanism.name!r} is already registered")
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


def unregister_mechanism(name: str) -> None:
    """Remove a mechanism registered from outside (the built-in ones stay)."""
    if any(m.name == name for m in BUILTIN):
        raise ValueError(f"privacy.mechanism {name!r} is built in")
    _REGISTRY.pop(name, None)


def get_mechanism(name: str) -> ClientMechanism:
    """The mechanism registered as ``name`` (KeyError for an unknown name; the config refuses it first)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown privacy.mechanism {name!r}; choose one of {', '.join(_REGISTRY)}") from None


def mechanism_names() -> tuple[str, ...]:
    """The registered names, the built-in ones first, in the order of registration."""
    return tuple(_REGISTRY)


def mechanisms() -> tuple[ClientMechanism, ...]:
    return tuple(_REGISTRY.values())


for _mechanism in BUILTIN:
    register_mechanism(_mechanism)
