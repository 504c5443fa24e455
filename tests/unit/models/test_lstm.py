"""The character LSTM (model ``char_lstm``) and LEAF's FEMNIST CNN (model ``leaf_cnn``): shapes, the LSTM's
arithmetic against torch's ``nn.LSTM``, its seeded initialisation, the registry, LLDM's refusal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raysim.algorithms.registry import get_method
from raysim.config import ConfigError, config_from_dict
from raysim.models import build_backbone, count_parameters, init_parameters, model_for
from raysim.models.lstm import FORGET_BIAS, CharLSTM


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as raysim trains (``runtime.torch_threads``): a step of the LSTM is thousands of
    tiny operations, each of which a second thread on a busy machine only delays."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _init(model: nn.Module, seed: int = 0) -> nn.Module:
    init_parameters(model, torch.Generator().manual_seed(seed))
    return model


def test_char_lstm_shapes_and_size():
    model = _init(build_backbone("char_lstm", 1, 28, 80))      # in_channels and image_size do not apply
    assert isinstance(model, CharLSTM)
    assert model.embed.weight.shape == (80, 8) and len(model.lstm) == 2
    assert [layer.hh.in_features for layer in model.lstm] == [256, 256] and model.head.out_features == 80
    # embedding 80·8, layer 1 4·256·(8 + 256) + 1024, layer 2 4·256·(256 + 256) + 1024, head 256·80 + 80
    assert count_parameters(model) == 640 + 271_360 + 525_312 + 20_560 == 817_872
    tokens = torch.randint(0, 80, (3, 80))
    with torch.no_grad():
        assert model(tokens).shape == (3, 80)
        assert model(tokens[:, :5]).shape == (3, 80)      # any window length
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.randn(2, 80))


def test_lstm_layers_compute_what_torch_lstm_computes():
    """PyTorch's gate order and cell arithmetic: the same weights in ``nn.LSTM`` (its second bias 0) give
    the same last hidden state of the top layer."""
    torch.manual_seed(0)
    model = _init(CharLSTM(13, embed_dim=4, hidden=6, layers=2)).double()
    reference = nn.LSTM(4, 6, num_layers=2, batch_first=True).double()
    with torch.no_grad():
        for k, layer in enumerate(model.lstm):
            getattr(reference, f"weight_ih_l{k}").copy_(layer.ih.weight)
            getattr(reference, f"weight_hh_l{k}").copy_(layer.hh.weight)
            getattr(reference, f"bias_ih_l{k}").copy_(layer.ih.bias)
            getattr(reference, f"bias_hh_l{k}").zero_()
        tokens = torch.randint(0, 13, (5, 9))
        states, _ = reference(model.embed(tokens))
        torch.testing.assert_close(model(tokens), model.head(states[:, -1]), rtol=1e-12, atol=1e-12)


def test_char_lstm_initialisation():
    torch.manual_seed(1)
    a = _init(build_backbone("char_lstm", 1, 1, 80), seed=3)
    torch.manual_seed(2)   # the global RNG must not matter
    b = _init(build_backbone("char_lstm", 1, 1, 80), seed=3)
    c = _init(build_backbone("char_lstm", 1, 1, 80), seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not any(torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))
    bound = 1 / 256 ** 0.5
    for layer in a.lstm:
        bias = layer.ih.bias
        assert torch.equal(bias[256:512], torch.full((256,), FORGET_BIAS))
        others = torch.cat([bias[:256], bias[512:], layer.ih.weight.flatten(), layer.hh.weight.flatten()])
        assert others.abs().max() <= bound and others.abs().max() > 0.9 * bound
        assert layer.hh.bias is None
    assert 0.9 < float(a.embed.weight.detach().std()) < 1.1         # nn.Embedding's N(0, 1)


def test_char_lstm_from_the_config_and_lldm_refused():
    info = SimpleNamespace(channels=1, image_size=1, num_classes=80)
    model = model_for(config_from_dict({"model": "char_lstm"}), info)
    assert model.head.out_features == 80 and model.embed.num_embeddings == 80
    cfg = config_from_dict({"model": "char_lstm", "method": "feddimdp"})
    with pytest.raises(ConfigError, match=r"^feddimdp\.lldm: .*char_lstm") as err:
        model_for(cfg, info, get_method("feddimdp").model_options(cfg))
    assert "\n" not in str(err.value)
    cfg = config_from_dict({"model": "char_lstm", "method": "feddimdp", "feddimdp": {"lldm": False}})
    assert isinstance(model_for(cfg, info, get_method(cfg.method).model_options(cfg)), CharLSTM)


def test_leaf_cnn_shapes_and_size():
    model = _init(build_backbone("leaf_cnn", 1, 28, 62))
    assert model.fc1.out_features == 2048
    # conv 1→32 5x5, conv 32→64 5x5, dense 7·7·64 → 2048, dense 2048 → 62 (LEAF's FEMNIST CNN)
    assert count_parameters(model) == 832 + 51_264 + 6_424_576 + 127_038 == 6_603_710
    with torch.no_grad():
        assert model(torch.randn(3, 1, 28, 28)).shape == (3, 62)
    lldm = build_backbone("leaf_cnn", 1, 28, 62, lldm=True, lldm_reduction=0.5)
    assert lldm.reduce is not None and lldm.fc1.in_features == 32 * 7 * 7


def test_small_cnn_shapes_and_size():
    model = _init(build_backbone("small_cnn", 3, 32, 10))
    # conv 3→32 3x3, conv 32→64 3x3, conv 64→64 3x3, dense 4·4·64 → 64, dense 64 → 10
    assert count_parameters(model) == 896 + 18_496 + 36_928 + 65_600 + 650 == 122_570
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        assert build_backbone("small_cnn", 1, 28, 62)(torch.randn(2, 1, 28, 28)).shape == (2, 62)
    lldm = build_backbone("small_cnn", 3, 32, 10, lldm=True, lldm_reduction=0.5)
    assert lldm.reduce is not None and lldm.fc1.in_features == 32 * 4 * 4
    with pytest.raises(ValueError, match="at least 18 px"):
        build_backbone("small_cnn", 1, 8, 10)
