"""Checkpoints: the format is versioned, and a checkpoint of another format is refused, not migrated."""

from __future__ import annotations

import pickle

import pytest

from raysim.simulation import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint


def test_a_checkpoint_of_another_format_is_refused_not_migrated():
    good = {"format_version": CHECKPOINT_FORMAT, "completed_rounds": 2}
    assert load_checkpoint(pickle.dumps(good)) == good
    older = {"format_version": 1, "completed_rounds": 2}          # no release context: cannot be guarded
    for blob in ({"completed_rounds": 2}, older, {"format_version": CHECKPOINT_FORMAT + 1, "completed_rounds": 2}, [1]):
        with pytest.raises(CheckpointError, match="--restart"):
            load_checkpoint(pickle.dumps(blob))

