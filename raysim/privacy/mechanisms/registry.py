"""The client-level mechanisms by name: ``privacy.mechanism`` is one of :func:`mechanism_names`.

The built-in ones (:mod:`~raysim.privacy.mechanisms.builtin`) are registered when this module is imported,
which ``raysim/__init__.py`` does; a mechanism from outside raysim registers itself when its module is
imported (the config's ``plugins`` key names such modules)::

    from raysim.privacy.mechanisms.base import ClientMechanism
    from raysim.privacy.mechanisms.registry import register_mechanism

    class HalfNoise(ClientMechanism): ...
    register_mechanism(HalfNoise())

Registering adds the object to the config's choices (``raysim.config.add_mechanism``), which validates
``privacy.mechanism`` against it; the config module imports no mechanism. Importing this module imports
no torch.
"""

from __future__ import annotations

from raysim.config import add_mechanism, client_mechanism, client_mechanisms, remove_mechanism
from raysim.privacy.mechanisms.base import ClientMechanism
from raysim.privacy.mechanisms.builtin import BUILTIN

__all__ = ["register_mechanism", "unregister_mechanism", "get_mechanism", "mechanism_names", "mechanisms",
           "ClientMechanism"]


def register_mechanism(mechanism: ClientMechanism) -> ClientMechanism:
    """Make ``privacy.mechanism: <mechanism.name>`` (under ``privacy.unit: client``) run ``mechanism``.
    Refuses a taken or empty name."""
    if not isinstance(mechanism, ClientMechanism):
        raise TypeError(f"a client-level mechanism is a ClientMechanism, got {type(mechanism).__name__}")
    if not mechanism.name:
        raise ValueError("a client-level mechanism needs a name")
    if mechanism.name in mechanism_names():
        raise ValueError(f"privacy.mechanism {mechanism.name!r} is already registered")
    add_mechanism(mechanism)
    return mechanism


def unregister_mechanism(name: str) -> None:
    """Remove a mechanism registered from outside (the built-in ones stay)."""
    if any(m.name == name for m in BUILTIN):
        raise ValueError(f"privacy.mechanism {name!r} is built in")
    remove_mechanism(name)


def get_mechanism(name: str) -> ClientMechanism:
    """The mechanism registered as ``name`` (KeyError for an unknown name; the config refuses it first)."""
    try:
        return client_mechanism(name)
    except KeyError:
        raise KeyError(f"unknown privacy.mechanism {name!r}; choose one of {', '.join(mechanism_names())}") from None


def mechanism_names() -> tuple[str, ...]:
    """The registered names, the built-in ones first, in the order of registration."""
    return tuple(m.name for m in client_mechanisms())


def mechanisms() -> tuple[ClientMechanism, ...]:
    return client_mechanisms()


for _mechanism in BUILTIN:
    if _mechanism.name not in mechanism_names():
        register_mechanism(_mechanism)
