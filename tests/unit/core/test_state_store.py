"""ClientStateStore: small states in memory, large ones in files; checkpoints name files, not tensors."""

from __future__ import annotations

import pickle

import pytest
import torch

from raysim.state_store import ClientStateStore, delete_files, tensor_bytes


def _state(n: int, value: float) -> dict:
    return {"control": torch.full((n,), value, dtype=torch.float32)}


def test_tensor_bytes_counts_nested_tensors():
    assert tensor_bytes({"a": torch.zeros(10), "b": [torch.zeros(3, dtype=torch.float64), 1.5], "c": None}) == 64
    assert tensor_bytes(None) == 0


def test_small_states_stay_in_memory_and_large_ones_spill(tmp_path):
    store = ClientStateStore(str(tmp_path), spill_bytes=400)
    small, large = _state(100, 1.0), _state(101, 2.0)            # 400 bytes: kept; 404 bytes: spilled
    store.put(3, small, server_round=1)
    store.put(7, large, server_round=1)
    store.put(9, None, server_round=1)
    assert list(store) == [3, 7, 9] and len(store) == 3 and 7 in store and 4 not in store
    assert store.memory_bytes() == 400 and store.spilled == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0000007-r000001.pt"]
    assert torch.equal(store.get(7)["control"], large["control"]) and store.get(7)["control"].dtype == torch.float32
    assert store.get(3) is small and store.get(9) is None and store.get(4, "none") == "none"


def test_replaced_files_are_released_not_deleted_until_asked(tmp_path):
    store = ClientStateStore(str(tmp_path), spill_bytes=0)
    store.put(1, _state(5, 1.0), server_round=1)
    store.put(1, _state(5, 2.0), server_round=3)
    store.put(1, _state(5, 2.0), server_round=3)   # a round redone after a resume rewrites its own file
    assert store.released() == ["c0000001-r000001.pt"] and store.released() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0000001-r000001.pt", "c0000001-r000003.pt"]
    delete_files(str(tmp_path), ["c0000001-r000001.pt", "c0000002-r000001.pt"])   # a missing one is skipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0000001-r000003.pt"]
    with pytest.raises(ValueError, match="not a client state file"):
        delete_files(str(tmp_path), ["../state.pkl"])


def test_without_checkpoints_replaced_files_go_at_once(tmp_path):
    store = ClientStateStore(str(tmp_path), spill_bytes=0, keep_released=False)
    store.put(1, _state(5, 1.0), server_round=1)
    store.put(1, _state(5, 2.0), server_round=2)
    assert store.released() == [] and [p.name for p in tmp_path.iterdir()] == ["c0000001-r000002.pt"]


def test_manifest_names_files_and_restores_bit_for_bit(tmp_path):
    store = ClientStateStore(str(tmp_path), spill_bytes=100)
    values = {c: _state(1000, 0.1 * c + 1e-7) for c in range(5)}
    for c, s in values.items():
        store.put(c, s, server_round=2)
    store.put(9, _state(2, 9.0), server_round=2)
    manifest = store.manifest()
    assert tensor_bytes(manifest) == 8                       # the checkpoint carries no spilled tensor
    assert len(pickle.dumps(manifest)) < 1000
    again = ClientStateStore(str(tmp_path), spill_bytes=100)
    again.load(pickle.loads(pickle.dumps(manifest)))
    assert list(again) == [0, 1, 2, 3, 4, 9]
    for c, s in values.items():
        assert torch.equal(again.get(c)["control"], s["control"])
    (tmp_path / "c0000002-r000002.pt").unlink()
    with pytest.raises(ValueError, match="missing"):
        ClientStateStore(str(tmp_path)).load(manifest)
    with pytest.raises(ValueError, match="state directory"):
        ClientStateStore(None).load(manifest)


def test_no_directory_keeps_everything_in_memory():
    store = ClientStateStore(None, spill_bytes=0)
    store.put(0, _state(10, 1.0), server_round=1)
    assert store.memory_bytes() == 40 and store.spilled == 0
    with pytest.raises(ValueError, match="spill_bytes"):
        ClientStateStore(None, spill_bytes=-1)
