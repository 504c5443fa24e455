"""raysim.training.local_train on a tiny model: steps, batches, clipping statistics and determinism."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from raysim.algorithms.base import ClientHooks
from raysim.config import config_from_dict
from raysim.messages import ClientTask, RoundPayload
from raysim.privacy.grad_sample import make_engine
from raysim.training import LocalSGD, example_norm_pass, local_train, sample_rate, steps_per_epoch

N, FEATURES, CLASSES = 50, 6, 3


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, FEATURES, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


def _train(clipping: str, clip: float = 1.0, sigma: float = 1.0, epochs: int = 2, seed: int = 0,
           norm_pass: bool = False):
    cfg = config_from_dict({"batch_size": 16, "lr": 0.1, "local_epochs": epochs, "seed": seed})
    model = _model()
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    hooks = ClientHooks(cfg, RoundPayload(1, w, w), ClientTask(3, 1, clip, sigma if clipping != "none" else 0.0))
    x, y = _data()
    if norm_pass:
        assert example_norm_pass(model, x, y, engine=make_engine("bk"), batch_size=16).shape == (N,)
    stats = local_train(model, x, y, hooks, clipping=clipping, engine=make_engine("bk"), per_layer=False,
                        seed=seed, client_id=3)
    return stats, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_step_count_is_epochs_times_ceil_n_over_b():
    assert steps_per_epoch(N, 16) == 4 and sample_rate(N, 16) == pytest.approx(0.32)
    for mode in ("per_sample", "batch", "none"):
        stats, _ = _train(mode)
        assert stats.num_steps == 2 * 4, mode
        assert math.isfinite(stats.train_loss)


def test_same_seed_same_weights_other_seed_differs():
    _, a = _train("per_sample")
    _, b = _train("per_sample")
    _, c = _train("per_sample", seed=1)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_tiny_clip_clips_every_example_and_a_huge_one_none():
    tiny, _ = _train("per_sample", clip=1e-6)
    huge, _ = _train("per_sample", clip=1e6, sigma=0.0)
    assert tiny.frac_clipped == 1.0 and huge.frac_clipped == 0.0


def test_the_pre_round_norm_pass_leaves_training_bit_for_bit_unchanged():
    """The pass draws no randomness and changes no weight, so the DP-SGD steps after it are the same."""
    for mode in ("per_sample", "batch"):
        assert torch.equal(_train(mode)[1], _train(mode, norm_pass=True)[1]), mode


def test_without_dp_every_example_is_seen_once_per_epoch():
    seen = []

    class Spy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _model()

        def forward(self, x):
            seen.append(len(x))
            return self.inner(x)

    cfg = config_from_dict({"batch_size": 16, "lr": 0.1, "local_epochs": 1})
    model = Spy()
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    x, y = _data()
    local_train(model, x, y, ClientHooks(cfg, RoundPayload(1, w, w), ClientTask(0, 1, 1.0, 0.0)), clipping="none",
                engine=make_engine("bk"), per_layer=False, seed=0, client_id=0)
    assert seen == [16, 16, 16, 2]     # a permutation in batches of B, the last one short


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_local_sgd_is_torch_sgd_bit_for_bit(momentum):
    """LocalSGD (which avoids torch.optim's import of torch._dynamo) makes torch.optim.SGD's updates exactly."""
    x, y = _data()
    ours, theirs = _model(), _model()
    opts = [LocalSGD(list(ours.parameters()), lr=0.1, momentum=momentum),
            torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=momentum)]
    for step in range(4):
        for model, opt in zip((ours, theirs), opts):
            for p in model.parameters():
                p.grad = None
            nn.functional.cross_entropy(model(x[step::4]), y[step::4]).backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(ours.parameters(), _model().parameters()))
