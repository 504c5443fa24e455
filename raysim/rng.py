"""The one place where random streams are derived.

Every random draw in raysim comes from a generator keyed by
``(seed, purpose, server_round, client_id, *extra)``. A result therefore does not depend
on which actor computed it, in which order, or whether it was retried: the same key gives
the same stream on any process. Purposes are names, hashed to stable integers (CRC32) so
that adding a purpose never shifts the streams of the others.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

__all__ = ["seed_sequence", "np_generator", "torch_generator", "torch_generators", "purpose_id", "GLOBAL"]

#: ``client_id`` used for streams that belong to the server rather than a client.
GLOBAL = -1


def purpose_id(purpose: str) -> int:
    """Stable non-negative integer for a stream purpose name."""
    if not purpose:
        raise ValueError("a random stream needs a non-empty purpose name")
    return zlib.crc32(purpose.encode("utf-8"))


def _key(purpose: str, server_round: int, client_id: int, extra: tuple[int, ...]) -> tuple[int, ...]:
    # SeedSequence spawn keys must be non-negative; shift so GLOBAL (-1) maps to 0.
    parts = (purpose_id(purpose), int(server_round) + 1, int(client_id) + 1) + tuple(int(e) + 1 for e in extra)
    if any(p < 0 for p in parts):
        raise ValueError(f"stream key parts must be >= -1, got {(purpose, server_round, client_id, extra)}")
    return parts


def seed_sequence(seed: int, purpose: str, server_round: int = 0, client_id: int = GLOBAL, *extra: int) -> np.random.SeedSequence:
    """``SeedSequence`` for one stream; the entry point all other helpers use."""
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.random.SeedSequence(int(seed), spawn_key=_key(purpose, server_round, client_id, extra))


def np_generator(seed: int, purpose: str, server_round: int = 0, client_id: int = GLOBAL, *extra: int) -> np.random.Generator:
    """NumPy generator (PCG64) for one stream."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, purpose, server_round, client_id, *extra)))


def torch_generator(seed: int, purpose: str, server_round: int = 0, client_id: int = GLOBAL, *extra: int,
                    device: str | torch.device = "cpu") -> torch.Generator:
    """``torch.Generator`` for one stream, seeded from the same key derivation."""
    return torch_generators(1, seed, purpose, server_round, client_id, *extra, device=device)[0]


def torch_generators(count: int, seed: int, purpose: str, server_round: int = 0, client_id: int = GLOBAL,
                     *extra: int, device: str | torch.device = "cpu") -> list[torch.Generator]:
    """``count`` generators for one stream, the k-th seeded with the k-th 64-bit word of the key's
    ``SeedSequence`` state; the first is :func:`torch_generator`'s, whatever ``count`` is."""
    states = seed_sequence(seed, purpose, server_round, client_id, *extra).generate_state(count, dtype=np.uint64)
    gens = []
    for state in states:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
        gens.append(gen)
    return gens
