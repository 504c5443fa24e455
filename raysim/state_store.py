"""Per-client persistent state (SCAFFOLD's c_i) kept off the driver's heap.

A client's state is what its hooks' ``finalize`` returned (a dict of tensors, or None); it lives on
the server so that a restarted actor recovers it. A population of N clients with model-sized states
would hold N models on the driver, so :class:`ClientStateStore` keeps in memory only states of at most
``spill_bytes`` of tensor data and writes larger ones to a file of their own (``torch.save``, written
under a dot-name and renamed into place) in the run's state directory, then drops them from memory.

Checkpoints: every file is named by its client and the round that wrote it (``c<client>-r<round>.pt``)
and is never rewritten with other content, so a checkpoint records only the store's *manifest*: per
client, its in-memory state or the name of the file that holds it (:meth:`ClientStateStore.manifest`),
never a copy of the spilled tensors. A file is released (:meth:`ClientStateStore.released`) once a
newer version replaces it; whoever writes the checkpoints deletes the released files after the
checkpoint that no longer names them is durable (:func:`delete_files`), so the latest checkpoint can
always be resumed, bit for bit, also when the process that wrote the files ran ahead of the writer.

The directory is a local path or a pyarrow filesystem URI (``s3://…``), like the results folder.
"""

from __future__ import annotations

import io
import posixpath
import re
from typing import Any, Iterable, Iterator

import pyarrow.fs as pafs
import torch
from raysim.config import ConfigError

__all__ = ["ClientStateStore", "SPILL_BYTES", "delete_files", "tensor_bytes"]

#: States with more tensor data than this go to a file (a SCAFFOLD control of the CIFAR-10 CNN is MBs).
SPILL_BYTES = 64 * 1024

_NAME = re.compile(r"^c(\d+)-r(\d+)\.pt$")


def tensor_bytes(obj: Any) -> int:
    """Bytes of tensor data in ``obj`` (tensors, also inside dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _filesystem(directory: str) -> tuple[pafs.FileSystem, str]:
    if "://" in directory:
        return pafs.FileSystem.from_uri(directory)
    import os
    return pafs.LocalFileSystem(), os.path.abspath(directory)


def delete_files(directory: str, names: Iterable[str]) -> None:
    """Delete the state files ``names`` (released by a store) from ``directory``; missing ones are skipped."""
    names = list(names)
    if not names:
        return
    fs, root = _filesystem(directory)
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"{name!r} is not a client state file name")
        path = posixpath.join(root, name)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_file(path)


class ClientStateStore:
    """Client id → persistent state; large states spilled to ``directory`` (None: all in memory).

    Reads and writes touch only the clients asked for, so a round costs O(participants) whatever
    the population. :meth:`get` returns the state as it was put (a spilled state is read back from
    its file, bit for bit)."""

    def __init__(self, directory: str | None = None, spill_bytes: int = SPILL_BYTES,
                 keep_released: bool = True) -> None:
        if spill_bytes < 0:
            raise ValueError(f"spill_bytes must be >= 0, got {spill_bytes}")
        self.directory = directory
        self.spill_bytes = int(spill_bytes)
        # False (a run without checkpoints): nothing can name a replaced file, so it is deleted at once.
        self.keep_released = keep_released
        self._memory: dict[int, Any] = {}
        self._files: dict[int, str] = {}       # client id → name of the file holding its state
        self._released: list[str] = []         # files replaced since the last manifest
        if directory is not None:
            self._fs, self._root = _filesystem(directory)
            self._fs.create_dir(self._root, recursive=True)

    # --- mapping-like access ------------------------------------------------------------
    def __contains__(self, client_id: object) -> bool:
        return client_id in self._memory or client_id in self._files

    def __iter__(self) -> Iterator[int]:
        yield from sorted([*self._memory, *self._files])

    def __len__(self) -> int:
        return len(self._memory) + len(self._files)

    def get(self, client_id: int, default: Any = None) -> Any:
        cid = int(client_id)
        if cid in self._memory:
            return self._memory[cid]
        name = self._files.get(cid)
        if name is None:
            return default
        path = posixpath.join(self._root, name)
        try:
            with self._fs.open_input_stream(path) as f:
                blob = f.read()
        except FileNotFoundError:
            raise ConfigError(f"the state of client {cid} is missing ({path}); the run cannot resume from this "
                             f"checkpoint, rerun it with --restart") from None
        # Files this run wrote itself (the same trust as the pickled checkpoint that names them).
        return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)

    def put(self, client_id: int, state: Any, server_round: int) -> None:
        """Keep ``state`` as client ``client_id``'s state after round ``server_round``."""
        cid = int(client_id)
        old = self._files.pop(cid, None)
        self._memory.pop(cid, None)
        if self.directory is None or tensor_bytes(state) <= self.spill_bytes:
            self._memory[cid] = state
        else:
            name = f"c{cid:07d}-r{int(server_round):06d}.pt"
            self._write(name, state)
            self._files[cid] = name
            if old == name:     # the same round redone (a resumed run): the file was just rewritten
                old = None
        if old is not None:
            if self.keep_released:
                self._released.append(old)
            else:
                delete_files(self.directory, [old])

    def _write(self, name: str, state: Any) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        final = posixpath.join(self._root, name)
        tmp = posixpath.join(self._root, f".{name}.tmp")
        with self._fs.open_output_stream(tmp) as out:
            out.write(buffer.getbuffer())
        self._fs.move(tmp, final)

    # --- footprint and checkpoints --------------------------------------------------------
    def memory_bytes(self) -> int:
        """Tensor bytes this store holds in memory (spilled states count nothing)."""
        return sum(tensor_bytes(s) for s in self._memory.values())

    @property
    def spilled(self) -> int:
        """How many clients' states are in files."""
        return len(self._files)

    def manifest(self) -> dict[str, Any]:
        """What a checkpoint records: in-memory states, and file names of spilled ones (not their tensors)."""
        return {"memory": dict(self._memory), "files": dict(self._files)}

    def released(self) -> list[str]:
        """Files replaced by newer versions since the last call: no manifest taken from now on names them.
        Delete them (:func:`delete_files`) only once a checkpoint taken after this call is durable."""
        out, self._released = self._released, []
        return out

    def load(self, manifest: dict[str, Any]) -> None:
        """Continue from ``manifest`` (what :meth:`manifest` returned, in a checkpoint)."""
        files = {int(c): str(n) for c, n in manifest.get("files", {}).items()}
        if files and self.directory is None:
            raise ConfigError("this checkpoint keeps client states in files; give the run its state directory")
        self._memory = {int(c): s for c, s in manifest.get("memory", {}).items()}
        self._files = files
        self._released = []
        missing = [n for n in files.values() if self._fs.get_file_info(posixpath.join(self._root, n)).type
                   == pafs.FileType.NotFound][:3]
        if missing:
            raise ConfigError(f"client state files {missing} named by the checkpoint are missing from "
                             f"{self.directory}; rerun with --restart")
