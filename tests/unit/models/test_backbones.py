"""GroupNorm backbones: shapes, LLDM insertion, seeded initialisation, and the bk engine on them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raysim.config import config_from_dict
from raysim.models import build_backbone, count_parameters, init_parameters, model_for
from raysim.models.lldm import LLDMBlock, TopKGradSparsifier
from raysim.privacy.grad_sample import make_engine

BACKBONES = ["resnet18_gn", "wrn16_4"]


def _init(model: nn.Module, seed: int = 0) -> nn.Module:
    init_parameters(model, torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("name", BACKBONES)
@pytest.mark.parametrize("channels, size", [(3, 32), (1, 32), (3, 96)])
def test_forward_shapes(name, channels, size):
    model = _init(build_backbone(name, channels, size, 10))
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    with torch.no_grad():
        assert model(torch.randn(2, channels, size, size)).shape == (2, 10)


def test_parameter_counts():
    # WRN-16-4: 2 blocks per stage at widths 64, 128, 256 (Zagoruyko & Komodakis: 2.7M).
    assert count_parameters(build_backbone("wrn16_4", 3, 32, 10)) == 2_748_890
    # ResNet-18 with the CIFAR stem (3x3 conv instead of 7x7): 11.17M, GroupNorm has BatchNorm's γ, β.
    assert count_parameters(build_backbone("resnet18_gn", 3, 32, 10)) == 11_173_962


@pytest.mark.parametrize("name, features", [("resnet18_gn", 512), ("wrn16_4", 256)])
def test_lldm_block_after_the_last_stage(name, features):
    model = _init(build_backbone(name, 3, 32, 10, lldm=True, lldm_reduction=0.25, lldm_keep_fraction=0.1))
    blocks = [m for m in model.modules() if isinstance(m, LLDMBlock)]
    assert len(blocks) == 1 and blocks[0].reduce.in_channels == features
    assert blocks[0].out_channels == math.ceil(0.25 * features) == model.fc.in_features
    assert isinstance(blocks[0].sparsify, TopKGradSparsifier) and blocks[0].sparsify.keep_fraction == 0.1
    # The sparsifier acts in the backward pass: the gradient reaching the reduced map is top-k per example.
    seen = {}
    blocks[0].reduce.register_full_backward_hook(lambda m, gin, gout: seen.update(g=gout[0]))
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    per_example = seen["g"].reshape(2, -1)
    kept = math.ceil(0.1 * per_example.shape[1])
    assert ((per_example != 0).sum(1) <= kept).all() and ((per_example != 0).sum(1) > 0).all()


def test_model_for_reads_the_config():
    info = SimpleNamespace(channels=3, image_size=32, num_classes=7)
    from raysim.algorithms.registry import get_method

    cfg = config_from_dict({"model": "wrn16_4", "method": "feddimdp", "lldm": {"reduction": 0.5}})
    model = model_for(cfg, info, get_method("feddimdp").model_options(cfg))
    assert model.fc.out_features == 7 and model.fc.in_features == 128
    assert type(model_for(config_from_dict({}), info)).__name__ == "CNN"


@pytest.mark.parametrize("name", BACKBONES)
def test_initialisation_depends_only_on_the_generator(name):
    torch.manual_seed(1)
    a = _init(build_backbone(name, 3, 32, 10), seed=3)
    torch.manual_seed(2)   # a different global RNG state must not matter
    b = _init(build_backbone(name, 3, 32, 10), seed=3)
    c = _init(build_backbone(name, 3, 32, 10), seed=4)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
    assert not all(torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))
    for m in a.modules():
        if isinstance(m, nn.GroupNorm):
            assert torch.equal(m.weight, torch.ones_like(m.weight)) and torch.equal(m.bias, torch.zeros_like(m.bias))


def test_init_refuses_modules_it_cannot_seed():
    with pytest.raises(ValueError, match="BatchNorm2d"):
        init_parameters(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), torch.Generator())



@pytest.mark.slow
@pytest.mark.parametrize("name, lldm", [("resnet18_gn", False), ("wrn16_4", False)])
def test_bk_clipped_sum_matches_vmap_on_backbones(name, lldm):
    """float64, 3 images of 16x16: the engine's norms and clipped sum on the real backbone."""
    model = _init(build_backbone(name, 3, 16, 10, lldm=lldm)).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 16, 16, generator=gen, dtype=torch.float64)
    y = torch.tensor([1, 2, 3])
    ref = make_engine("vmap").clipped_sum(model, x, y, 1.0)
    assert 0 < ref.num_clipped   # clipping is exercised
    res = make_engine("bk").clipped_sum(model, x, y, 1.0)
    torch.testing.assert_close(res.per_example_norms, ref.per_example_norms, rtol=1e-9, atol=0)
    for got, want in zip(res.grads, ref.grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("name", BACKBONES)
def test_backbones_pickle(name):
    import pickle

    model = _init(build_backbone(name, 3, 32, 10, lldm=True))
    copy = pickle.loads(pickle.dumps(model))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), copy.parameters()))
