"""Messages cross process boundaries with their tensors as NumPy arrays and come back as equal,
writable tensors (raysim.messages)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from raysim.messages import ClientResult, ClientTask, RoundPayload, _tensor_from_wire, _WireTensor


def _result() -> ClientResult:
    return ClientResult(client_id=3, server_round=2, num_samples=10, num_steps=4, delta=torch.randn(50),
                        train_loss=0.5, frac_clipped=0.25,
                        uploads={"norms": [torch.arange(3.0), (torch.ones(2, 2),)], "count": 7},
                        diagnostics={"x": 1.0}, client_state={"c": torch.zeros(4, dtype=torch.float64),
                                                              "half": torch.ones(3, dtype=torch.bfloat16)},
                        seconds=0.1)


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("protocol", [2, 5])
def test_round_trip_keeps_every_field(protocol):
    r = _result()
    back = pickle.loads(pickle.dumps(r, protocol=protocol))
    for name in r.__dataclass_fields__:
        _same(getattr(r, name), getattr(back, name))
    task = ClientTask(1, 2, (1.0, 2.0), 0.7, {"c": torch.ones(3)})
    _same(task.client_state, pickle.loads(pickle.dumps(task, protocol=protocol)).client_state)


def test_tensors_travel_as_arrays_out_of_band():
    r = _result()
    buffers: list = []
    data = pickle.dumps(r, protocol=5, buffer_callback=buffers.append)
    # The delta's 50 float32 values go out of band, not into the pickle stream.
    assert sum(memoryview(b).nbytes for b in buffers) >= 50 * 4
    assert len(data) < 50 * 4 + 1000
    back = pickle.loads(data, buffers=buffers)
    assert torch.equal(back.delta, r.delta)


def test_a_shared_tensor_stays_shared():
    w = torch.randn(100)
    p = pickle.loads(pickle.dumps(RoundPayload(1, w, w, {"w": w}), protocol=5))
    assert p.start_weights is p.global_weights is p.broadcast["w"]


def test_read_only_arrays_become_writable_tensors():
    array = np.arange(4, dtype=np.float32)
    array.setflags(write=False)               # as Ray maps an object-store buffer
    t = _tensor_from_wire(array)
    t.add_(1.0)                                # would be undefined behaviour on the shared buffer
    assert array.tolist() == [0.0, 1.0, 2.0, 3.0] and t.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_tensors_that_need_grad_or_lack_a_numpy_dtype_stay_tensors():
    from raysim.messages import _to_wire
    assert isinstance(_to_wire(torch.ones(2), {}), _WireTensor)
    assert isinstance(_to_wire(torch.ones(2, requires_grad=True), {}), torch.Tensor)
    assert isinstance(_to_wire(torch.ones(2, dtype=torch.bfloat16), {}), torch.Tensor)

