"""Per-example clipping engines against a naive per-example loop (float64, so 1e-5 is meaningful)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.models import build_backbone, init_parameters
from raysim.models.cnn import build_model
from raysim.models.lstm import CharLSTM
from raysim.models.lldm import TopKGradSparsifier
from raysim.privacy import layer_grads
from raysim.privacy.grad_sample import (
    ENGINES, BookKeepingEngine, make_engine, parametrised_layers, register_engine,
)

TOL = dict(rtol=1e-5, atol=1e-7)


def per_example_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Loop over examples: zero_grad, backward of that example's loss alone, copy the grads."""
    params = list(model.parameters())
    out = []
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        out.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    model.zero_grad(set_to_none=True)
    return out


def naive(model: nn.Module, examples: list[list[torch.Tensor]], thresholds, per_layer: bool = False):
    """Clip each example's gradient (flat or per layer) and accumulate, from ``per_example_grads``."""
    params = list(model.parameters())
    position = {id(p): j for j, p in enumerate(params)}
    layer_ids = [[position[id(p)] for p in layer.parameters(recurse=False)] for layer in parametrised_layers(model)]
    acc = [torch.zeros_like(p) for p in params]
    norms, layer_norms, clipped, clipped_grads = [], [], 0, []
    for grads in examples:
        per_layer_sq = torch.stack([sum(grads[j].pow(2).sum() for j in ids) for ids in layer_ids])
        norm = per_layer_sq.sum().sqrt()
        norms.append(norm)
        layer_norms.append(per_layer_sq.sqrt())
        if per_layer:
            scale = [1.0] * len(params)
            for ids, sq, c in zip(layer_ids, per_layer_sq, thresholds):
                for j in ids:
                    scale[j] = min(1.0, c / (float(sq.sqrt()) + 1e-6))
            clipped += int(any(float(sq.sqrt()) > c for sq, c in zip(per_layer_sq, thresholds)))
            scaled = [g * f for g, f in zip(grads, scale)]
        else:
            factor = min(1.0, thresholds / (float(norm) + 1e-6))
            clipped += int(float(norm) > thresholds)
            scaled = [g * factor for g in grads]
        clipped_grads.append(scaled)
        acc = [a + s for a, s in zip(acc, scaled)]
    return acc, torch.stack(norms), torch.stack(layer_norms), clipped, clipped_grads


class OddConvNet(nn.Module):
    """Strided/dilated conv, 'same' + reflect padding, a Linear on 3-D input, a Linear reused."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2, dilation=2, padding=1)
        self.conv2 = nn.Conv2d(6, 5, (3, 2), padding="same", padding_mode="reflect", dilation=(1, 2))
        self.mix = nn.Linear(5, 5)          # on (B, 25, 5): positions share the weight
        self.shared = nn.Linear(40, 40)     # called twice
        self.head = nn.Linear(40, 4, bias=False)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))      # (B, 5, 5, 5) for 11x11 input
        x = torch.tanh(self.mix(x.flatten(2).transpose(1, 2)))     # (B, 25, 5)
        x = x.reshape(x.shape[0], -1)[:, :40]
        x = torch.tanh(self.shared(torch.tanh(self.shared(x))))
        return self.head(x)


class GroupNormNet(nn.Module):
    """Conv, GroupNorm (on 4-D maps and on flat features), LLDM's 1x1 reduction and top-k
    sparsifier, Linear: GroupNorm's per-example grads sit below and above the sparsifier."""

    def __init__(self, sparsify: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, 8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(8, 16)
        self.reduce = nn.Conv2d(16, 8, 1, bias=False)
        self.sparsify = TopKGradSparsifier(0.5) if sparsify else nn.Identity()
        self.fc1 = nn.Linear(8 * 4 * 4, 12)
        self.norm3 = nn.GroupNorm(3, 12)
        self.head = nn.Linear(12, 5)
        with torch.no_grad():  # away from GroupNorm's identity init, so a swapped γ/β would show
            for norm in (self.norm1, self.norm2, self.norm3):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = torch.relu(self.norm1(self.conv1(x)))
        x = torch.relu(self.norm2(self.conv2(x)))
        x = self.sparsify(torch.relu(self.reduce(x)))
        return self.head(torch.tanh(self.norm3(self.fc1(x.flatten(1)))))


class GhostConvNet(nn.Module):
    """Convs with few output positions (ghost-norm path, clipped sum as a conv weight grad):
    strided and dilated, then 'same' with reflect padding, the latter called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, stride=2, dilation=2, padding=1)              # 7x7 -> 3x3
        self.conv2 = nn.Conv2d(32, 32, 3, padding="same", padding_mode="reflect")
        self.head = nn.Linear(32 * 9, 4)

    def forward(self, x):
        x = torch.tanh(self.conv1(x))
        x = torch.tanh(self.conv2(torch.tanh(self.conv2(x))))
        return self.head(x.flatten(1))


def _between_middle(values: torch.Tensor) -> float:
    ordered = values.sort().values
    mid = len(ordered) // 2
    return float(ordered[mid - 1] + ordered[mid]) / 2


#: Small character LSTMs (the class of model ``char_lstm``): (vocab, embedding, hidden, window). At the
#: first sizes every layer takes the explicit per-example path (embedding: 7²·4 ≥ (11 + 7)·3; the
#: recurrent Linear over 6 steps: 6·(5 + 20) ≥ 5·20), at the second the ghost norm (3²·5 < (40 + 3)·4;
#: 2·(16 + 64) < 16·64; the input projections over 3 positions: 3·(4 + 64) < 4·64, 3·(16 + 64) < 16·64).
LSTMS = {"lstm_explicit": (11, 3, 5, 7), "lstm_ghost": (40, 4, 16, 3)}


def _data(shape, classes, batch=8, seed=0, kind=None):
    """Gaussian inputs of ``shape``, or for a token model (``kind`` in ``LSTMS``) token ids of ``shape``
    in [0, classes)."""
    gen = torch.Generator().manual_seed(seed)
    if kind in LSTMS:
        x = torch.randint(0, classes, (batch, *shape), generator=gen)
    else:
        x = torch.randn((batch, *shape), generator=gen, dtype=torch.float64)
    return x, torch.randint(0, classes, (batch,), generator=gen)


def _model(kind: str) -> tuple[nn.Module, tuple[int, ...], int]:
    torch.manual_seed(0)
    if kind == "cnn32":
        return build_model(3, 32, 10).double(), (3, 32, 32), 10
    if kind == "cnn32_lldm":
        return build_model(3, 32, 10, lldm=True).double(), (3, 32, 32), 10
    if kind == "cnn8_gray":   # conv2 here takes the ghost-norm path (L = 16: 16·(800 + 64) < 800·64)
        return build_model(1, 8, 10).double(), (1, 8, 8), 10
    if kind == "ghost_conv":  # 9·(27 + 32) < 27·32 and (2 calls) 18·(288 + 32) < 288·32
        return GhostConvNet().double(), (3, 7, 7), 4
    if kind in ("gn_lldm", "gn"):
        return GroupNormNet(sparsify=kind == "gn_lldm").double(), (3, 8, 8), 5
    if kind == "leaf_cnn":    # LEAF's FEMNIST CNN (dense 2048) on 8x8 inputs, to keep the naive loop small
        return build_backbone("leaf_cnn", 1, 8, 62).double(), (1, 8, 8), 62
    if kind == "small_cnn":   # 'valid' 3x3 convs, the smallest input they take
        return build_backbone("small_cnn", 3, 18, 10).double(), (3, 18, 18), 10
    if kind in LSTMS:
        vocab, embed, hidden, window = LSTMS[kind]
        model = CharLSTM(vocab, embed, hidden)
        init_parameters(model, torch.Generator().manual_seed(0))
        return model.double(), (window,), vocab
    return OddConvNet().double(), (3, 11, 11), 4


MODELS = ["cnn32", "cnn32_lldm", "cnn8_gray", "odd_conv", "gn_lldm", "ghost_conv", "leaf_cnn", "small_cnn", *LSTMS]


def _assert_grads_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("kind", MODELS)
def test_bk_matches_naive_loop_flat(kind):
    model, shape, classes = _model(kind)
    x, y = _data(shape, classes, kind=kind)
    examples = per_example_grads(model, x, y)
    _, norms, _, _, _ = naive(model, examples, 1.0)
    clip = _between_middle(norms)  # half the examples get clipped, none sits at the threshold
    want, norms, layer_norms, clipped, per_example = naive(model, examples, clip)
    assert 0 < clipped < x.shape[0]
    for grads in per_example:  # the thing being summed really is clipped
        assert float(torch.sqrt(sum(g.pow(2).sum() for g in grads))) <= clip * (1 + 1e-9)
    res = make_engine("bk").clipped_sum(model, x, y, clip)
    _assert_grads_close(res.grads, want)
    torch.testing.assert_close(res.per_example_norms, norms, **TOL)
    torch.testing.assert_close(res.per_layer_norms, layer_norms, **TOL)
    assert res.num_clipped == clipped
    expected_loss = F.cross_entropy(model(x), y, reduction="sum").item()
    assert res.loss_sum == pytest.approx(expected_loss, rel=1e-9)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", ["cnn32_lldm", "cnn8_gray", "odd_conv", "gn_lldm", "ghost_conv", "leaf_cnn",
                                  *LSTMS])
def test_bk_matches_naive_loop_per_layer(kind):
    model, shape, classes = _model(kind)
    x, y = _data(shape, classes, seed=1, kind=kind)
    examples = per_example_grads(model, x, y)
    _, _, layer_norms, _, _ = naive(model, examples, 1.0)
    thresholds = [_between_middle(layer_norms[:, k]) for k in range(layer_norms.shape[1])]
    want, _, _, clipped, _ = naive(model, examples, thresholds, per_layer=True)
    assert 0 < clipped <= x.shape[0]
    res = make_engine("bk").clipped_sum(model, x, y, thresholds, per_layer=True)
    _assert_grads_close(res.grads, want)
    assert res.num_clipped == clipped


@pytest.fixture
def one_thread():
    """One torch thread, as raysim trains (``runtime.torch_threads``): a step of the LSTM is thousands of
    tiny operations, each of which a second thread on a busy machine only delays."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_char_lstm_at_its_real_sizes_matches_naive_loop():
    """Model ``char_lstm`` as built for LEAF's Shakespeare (80 characters, 80-character windows): its
    embedding scatter, explicit first input projection, ghost-norm recurrent Linears over 79 calls."""
    model = build_backbone("char_lstm", 1, 1, 80)
    init_parameters(model, torch.Generator().manual_seed(0))
    model = model.double()
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randint(0, 80, (2, 80), generator=gen), torch.randint(0, 80, (2,), generator=gen)
    examples = per_example_grads(model, x, y)
    _, norms, _, _, _ = naive(model, examples, 1.0)
    clip = float(norms.mean())      # one example clipped, one not
    want, norms, layer_norms, clipped, _ = naive(model, examples, clip)
    res = make_engine("bk").clipped_sum(model, x, y, clip)
    assert clipped == res.num_clipped == 1
    _assert_grads_close(res.grads, want)
    torch.testing.assert_close(res.per_layer_norms, layer_norms, **TOL)


class EmbeddingNet(nn.Module):
    """An Embedding with a padding row, called twice (on two token windows), into a Linear on the sequence."""

    def __init__(self, vocab: int, dim: int, padding_idx: int | None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.mix = nn.Linear(dim, 3)

    def forward(self, tokens):
        half = tokens.shape[1] // 2
        x = torch.cat([self.embed(tokens[:, :half]), torch.tanh(self.embed(tokens[:, half:]))], dim=1)
        return self.mix(torch.tanh(x)).sum(1)


@pytest.mark.parametrize("vocab, dim, length", [(5, 3, 8), (300, 2, 6)], ids=["scatter", "ghost"])
def test_embedding_with_padding_row_called_twice_matches_naive_loop(vocab, dim, length):
    """Repeated tokens within an example, the padding row (no gradient), two calls summed; both ways
    of the per-example norm, flat and per-layer clipping."""
    assert layer_grads.embedding_uses_ghost_norm(vocab, dim, length) == (vocab > 5)
    torch.manual_seed(0)
    model = EmbeddingNet(vocab, dim, padding_idx=1).double()
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(0, min(vocab, 4), (7, length), generator=gen)     # few distinct tokens: many repeats
    x[:, 0] = 1
    y = torch.randint(0, 3, (7,), generator=gen)
    examples = per_example_grads(model, x, y)
    assert all(torch.count_nonzero(grads[0][1]) == 0 for grads in examples)
    _, norms, layer_norms, _, _ = naive(model, examples, 1.0)
    for clip, per_layer in ((_between_middle(norms), False),
                            ([_between_middle(layer_norms[:, k]) for k in range(2)], True)):
        want, _, _, clipped, _ = naive(model, examples, clip, per_layer=per_layer)
        res = make_engine("bk").clipped_sum(model, x, y, clip, per_layer=per_layer)
        _assert_grads_close(res.grads, want)
        assert res.num_clipped == clipped > 0
        vm = make_engine("vmap").clipped_sum(model, x, y, clip, per_layer=per_layer)
        _assert_grads_close(vm.grads, want)


def test_single_example_clipped_sum_has_norm_at_most_c():
    model, shape, classes = _model("cnn32_lldm")
    x, y = _data(shape, classes, batch=4, seed=2)
    for i in range(4):
        res = make_engine("bk").clipped_sum(model, x[i:i + 1], y[i:i + 1], 0.05)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in res.grads))
        assert res.per_example_norms[0] > 0.05  # really clipped, not trivially small
        assert float(norm) <= 0.05 * (1 + 1e-9)
        assert float(norm) == pytest.approx(0.05, rel=1e-4)


def test_lldm_sparsifier_changes_gradients():
    """Guard against a vacuous LLDM test: with κ = 1 the gradients differ from κ = 0.5."""
    torch.manual_seed(0)
    sparse = build_model(3, 32, 10, lldm=True).double()
    torch.manual_seed(0)
    dense = build_model(3, 32, 10, lldm=True, lldm_keep_fraction=1.0).double()
    x, y = _data((3, 32, 32), 10)
    a = make_engine("bk").clipped_sum(sparse, x, y, 1e6)
    b = make_engine("bk").clipped_sum(dense, x, y, 1e6)
    assert not torch.allclose(a.grads[0], b.grads[0])
    torch.testing.assert_close(a.grads[-1], b.grads[-1])  # layers above the sparsifier agree


def test_float32_close_to_float64():
    model, shape, classes = _model("cnn32_lldm")
    x, y = _data(shape, classes)
    want = make_engine("bk").clipped_sum(model, x, y, 0.5)
    res = make_engine("bk").clipped_sum(model.float(), x.float(), y, 0.5)
    for g, w in zip(res.grads, want.grads):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
    torch.testing.assert_close(res.per_example_norms.double(), want.per_example_norms, rtol=1e-4, atol=0)


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("kind", ["cnn8_gray", "odd_conv", "gn", *LSTMS])
def test_vmap_engine_agrees_with_bk(kind, per_layer):
    model, shape, classes = _model(kind)
    x, y = _data(shape, classes, seed=3, kind=kind)
    k = len(parametrised_layers(model))
    clip = [0.3] * k if per_layer else 0.5
    bk = make_engine("bk").clipped_sum(model, x, y, clip, per_layer=per_layer)
    vm = make_engine("vmap").clipped_sum(model, x, y, clip, per_layer=per_layer)
    _assert_grads_close(vm.grads, bk.grads)
    torch.testing.assert_close(vm.per_layer_norms, bk.per_layer_norms, **TOL)
    assert vm.num_clipped == bk.num_clipped > 0
    assert vm.loss_sum == pytest.approx(bk.loss_sum, rel=1e-9)


def test_frozen_layer_gets_zero_grad_and_no_norm():
    model, shape, classes = _model("cnn8_gray")
    model.conv1.weight.requires_grad_(False)
    x, y = _data(shape, classes)
    want, norms, _, _, _ = naive(model, per_example_grads(model, x, y), 0.2)
    res = make_engine("bk").clipped_sum(model, x, y, 0.2)
    _assert_grads_close(res.grads, want)
    torch.testing.assert_close(res.per_example_norms, norms, **TOL)
    assert torch.count_nonzero(res.grads[0]) == 0 and torch.count_nonzero(res.grads[1]) > 0


@pytest.mark.parametrize("name", ["bk", "vmap"])
def test_empty_batch(name):
    model, shape, classes = _model("cnn8_gray")
    x, y = torch.zeros((0, *shape), dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    res = make_engine(name).clipped_sum(model, x, y, 1.0)
    assert res.num_clipped == 0 and res.loss_sum == 0.0
    assert res.per_example_norms.shape == (0,)
    assert res.per_layer_norms.shape == (0, 4)
    assert [g.shape for g in res.grads] == [p.shape for p in model.parameters()]
    assert all(torch.count_nonzero(g) == 0 for g in res.grads)


@pytest.mark.parametrize("module, x, match", [
    (nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)), torch.randn(2, 12),
     "'1' is a BatchNorm1d"),
    (nn.Sequential(nn.Conv2d(2, 4, 1, groups=2), nn.Flatten(), nn.Linear(16, 3)), torch.randn(2, 2, 2, 2),
     "'0'.*groups=2"),
    (nn.Sequential(nn.Embedding(5, 3, max_norm=1.0), nn.Flatten(), nn.Linear(6, 3)), torch.tensor([[0, 1], [2, 3]]),
     "'0'.*max_norm"),
    (nn.Sequential(nn.Embedding(5, 3, scale_grad_by_freq=True), nn.Flatten(), nn.Linear(6, 3)),
     torch.tensor([[0, 1], [2, 3]]), "'0'.*scale_grad_by_freq"),
])
def test_unsupported_modules_are_named(module, x, match):
    with pytest.raises(ValueError, match=match):
        BookKeepingEngine().clipped_sum(module, x, torch.tensor([0, 1]), 1.0)


def test_inplace_modified_output_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="in place"):
        make_engine("bk").clipped_sum(model, torch.randn(3, 4), torch.tensor([0, 1, 0]), 1.0)


def test_tied_weights_are_refused():
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, nn.Tanh(), second)
    with pytest.raises(ValueError, match="tied"):
        make_engine("bk").clipped_sum(model, torch.randn(3, 4), torch.tensor([0, 1, 0]), 1.0)


def test_threshold_validation():
    model, shape, classes = _model("cnn8_gray")
    x, y = _data(shape, classes, batch=2)
    with pytest.raises(ValueError, match="4 thresholds"):
        make_engine("bk").clipped_sum(model, x, y, [1.0, 1.0], per_layer=True)
    with pytest.raises(ValueError, match="per_layer=True"):
        make_engine("bk").clipped_sum(model, x, y, [1.0] * 4)
    with pytest.raises(ValueError, match="> 0"):
        make_engine("bk").clipped_sum(model, x, y, 0.0)


def test_registry():
    assert {"bk", "vmap"} <= set(ENGINES)
    assert make_engine("bk").name == "bk" and make_engine().name == "bk"
    with pytest.raises(ValueError, match="already registered"):
        register_engine("bk")(type("Other", (), {}))
    with pytest.raises(ValueError, match="unknown"):
        make_engine("nope")


@pytest.mark.parametrize("conv", [
    nn.Conv2d(3, 4, 5, padding=2),
    nn.Conv2d(2, 3, (3, 2), stride=(2, 1), dilation=(1, 2), padding=(1, 0)),
    nn.Conv2d(3, 2, 3, stride=2, dilation=2, padding=1),
    nn.Conv2d(4, 3, 3, padding="same", padding_mode="reflect", dilation=2),
    nn.Conv2d(5, 3, 1, stride=3),   # rows past the last window are not part of any patch
], ids=["pad", "stride-dilation", "odd", "same-reflect", "1x1-stride"])
def test_conv_per_example_weight_grads_both_ways(conv):
    """The patch matmul (transposed) and the groups=B conv equal per-example weight grads from
    autograd, from NCHW and from channels-last operands."""
    conv = conv.double()
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(3, conv.in_channels, 11, 10, generator=gen, dtype=torch.float64)
    g = torch.randn_like(conv(a), dtype=torch.float64)
    want = []
    for i in range(a.shape[0]):
        (w,) = torch.autograd.grad(conv(a[i:i + 1]), conv.weight, g[i:i + 1])
        want.append(w.reshape(conv.out_channels, -1))
    want = torch.stack(want)
    last = torch.channels_last
    for a_in, g_in in ((a, g), (a.contiguous(memory_format=last), g.contiguous(memory_format=last))):
        torch.testing.assert_close(layer_grads._conv_im2col(conv, a_in, g_in).transpose(1, 2), want, **TOL)
        torch.testing.assert_close(layer_grads._conv_grouped(conv, a_in, g_in), want, **TOL)


class TwoConvNet(nn.Module):
    """``first`` (optionally called twice, on the input and on its own tanh output), then ``second``
    and a Linear head."""

    def __init__(self, first: nn.Conv2d, second: nn.Conv2d, twice: bool = False) -> None:
        super().__init__()
        self.first, self.second, self.twice = first, second, twice
        self.head = nn.LazyLinear(3)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        if self.twice:
            x = torch.tanh(self.first(x))
        return self.head(torch.tanh(self.second(x)).flatten(1))


def _conv_paths(monkeypatch) -> dict[str, list[int]]:
    """Records the input channels of each conv that goes through the patch matmul or the groups=B conv."""
    seen: dict[str, list[int]] = {"im2col": [], "grouped": []}
    for key, name in (("im2col", "_conv_im2col"), ("grouped", "_conv_grouped")):
        real = getattr(layer_grads, name)

        def spy(layer, a, g, real=real, key=key):
            seen[key].append(layer.in_channels)
            return real(layer, a, g)
        monkeypatch.setattr(layer_grads, name, spy)
    return seen


FEW_CHANNEL_CONVS = {
    "pad": (lambda: nn.Conv2d(3, 6, 5, padding=2), False),
    "stride": (lambda: nn.Conv2d(2, 6, 3, stride=2, padding=1), False),
    "stride-dilation": (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 2), padding=(1, 0)), False),
    "same-reflect": (lambda: nn.Conv2d(1, 6, 3, padding="same", padding_mode="reflect", dilation=2, bias=False), False),
    "called-twice": (lambda: nn.Conv2d(4, 4, 3, padding=1), True),
}


@pytest.mark.parametrize("variant", sorted(FEW_CHANNEL_CONVS))
def test_few_channel_conv_goes_through_the_patch_matmul_and_matches_vmap(variant, monkeypatch):
    """A conv with at most 4 input channels gets its per-example grads from the patch matmul, several
    chunks of the batch of them, held transposed; its norms and clipped sum equal the exact engine's.
    The conv after it takes the groups=B conv if it has more than 4 input channels."""
    make_first, twice = FEW_CHANNEL_CONVS[variant]
    torch.manual_seed(0)
    first = make_first()
    model = TwoConvNet(first, nn.Conv2d(first.out_channels, 5, 3), twice)
    x, y = _data((first.in_channels, 12, 11), 3, batch=9, seed=6)
    model(x.float())
    model = model.double()
    monkeypatch.setattr(layer_grads, "IM2COL_CHUNK_BYTES", 4 * 8 * first.weight[0].numel() * 36)  # ≤4 examples
    seen = _conv_paths(monkeypatch)
    for per_layer in (False, True):
        clip = [0.2, 0.2, 0.2] if per_layer else 0.4
        bk = make_engine("bk").clipped_sum(model, x, y, clip, per_layer=per_layer)
        vm = make_engine("vmap").clipped_sum(model, x, y, clip, per_layer=per_layer)
        _assert_grads_close(bk.grads, vm.grads)
        torch.testing.assert_close(bk.per_layer_norms, vm.per_layer_norms, **TOL)
        assert bk.num_clipped == vm.num_clipped > 0
    assert first.in_channels in seen["im2col"] and len(seen["im2col"]) >= 2 * 3
    assert max(seen["im2col"]) <= 4 < min(seen["grouped"], default=5)
    assert seen["grouped"] or twice


def test_few_channel_conv_in_float32_is_close_to_the_exact_engine_in_float64():
    torch.manual_seed(0)
    model = build_model(3, 32, 10)
    x, y = _data((3, 32, 32), 10, batch=16, seed=7)
    got = make_engine("bk").clipped_sum(model, x.float(), y, 1.0)
    want = make_engine("vmap").clipped_sum(model.double(), x, y, 1.0)
    torch.testing.assert_close(got.per_layer_norms[:, 0].double(), want.per_layer_norms[:, 0], rtol=1e-5, atol=0)
    torch.testing.assert_close(got.grads[0].double(), want.grads[0], rtol=1e-5, atol=1e-7)


def test_convs_with_more_input_channels_or_a_groups_b_shape_keep_the_groups_b_conv(monkeypatch):
    """Above 4 input channels the per-example grads come from the groups=B conv, in the weight's
    layout, and still match the exact engine."""
    torch.manual_seed(0)
    model = TwoConvNet(nn.Conv2d(5, 4, 3, stride=2, padding=1), nn.Conv2d(4, 6, 3, padding="same"))
    x, y = _data((5, 12, 11), 3, batch=9, seed=8)
    model(x.float())
    model = model.double()
    seen = _conv_paths(monkeypatch)
    bk = make_engine("bk").clipped_sum(model, x, y, 0.4)
    vm = make_engine("vmap").clipped_sum(model, x, y, 0.4)
    _assert_grads_close(bk.grads, vm.grads)
    torch.testing.assert_close(bk.per_layer_norms, vm.per_layer_norms, **TOL)
    assert seen == {"im2col": [4], "grouped": [5]}
    stats = layer_grads.LayerStats(model.first, [(x, torch.randn_like(model.first(x)))], 9, x.dtype, x.device)
    assert not stats.weight_transposed and stats.per_example["weight"][0].shape[1:] == (4, 5 * 9)


def test_group_norm_with_frozen_weight():
    model, shape, classes = _model("gn")
    model.norm2.weight.requires_grad_(False)
    x, y = _data(shape, classes, seed=5)
    want, norms, _, _, _ = naive(model, per_example_grads(model, x, y), 0.3)
    res = make_engine("bk").clipped_sum(model, x, y, 0.3)
    _assert_grads_close(res.grads, want)
    torch.testing.assert_close(res.per_example_norms, norms, **TOL)


class ViewNet(nn.Module):
    """Flattens with .view(), which a channels-last feature map refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return self.fc(h.view(h.shape[0], -1))


def test_model_that_views_its_feature_maps():
    torch.manual_seed(0)
    model = ViewNet().double()
    x, y = _data((3, 8, 8), 3)
    with pytest.raises(RuntimeError, match="view"):
        model(x.contiguous(memory_format=torch.channels_last))   # the case the engine falls back on
    want, norms, _, _, _ = naive(model, per_example_grads(model, x, y), 0.5)
    res = make_engine("bk").clipped_sum(model, x, y, 0.5)
    _assert_grads_close(res.grads, want)
    torch.testing.assert_close(res.per_example_norms, norms, **TOL)


def test_thread_count_changes_only_the_last_bits():
    """One DP step of the paper CNN (noise included) is bit-identical run to run at a fixed thread
    count; between 1 and 2 threads it differs by float32 rounding only (docs/cluster.md)."""
    from raysim.privacy.clipping import privatize
    from raysim.noise import GaussianNoise

    def step(threads: int) -> list[torch.Tensor]:
        torch.set_num_threads(threads)
        model = build_model(3, 32, 10)
        for k, p in enumerate(model.parameters()):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(k)) * 0.05)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(32, 3, 32, 32, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        return privatize(model, x, y, mode="per_sample", clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=32,
                         noise=GaussianNoise(0, "noise"), engine=make_engine("bk")).grads

    before = torch.get_num_threads()
    try:
        one, one_again, two = step(1), step(1), step(2)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, one_again))
    worst = max(float((a - b).abs().max()) for a, b in zip(one, two))
    assert worst <= 1e-6, worst
    print(f"largest difference between 1 and 2 threads: {worst:.2e}")


# --------------------------------------------------------------------------- the pre-round norm pass

@pytest.mark.parametrize("name", sorted(ENGINES))
def test_norm_pass_gives_every_examples_norm_and_leaves_the_model_and_global_rng_alone(name):
    from raysim.training import NORM_PASS_CHUNK, example_norm_pass
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    n = NORM_PASS_CHUNK + 7                       # two chunks
    x, y = torch.randn(n, 12, dtype=torch.float64), torch.randint(0, 3, (n,))
    before = [p.detach().clone() for p in model.parameters()]
    state = torch.get_rng_state()
    engine = make_engine(name)
    got = example_norm_pass(model, x, y, engine=engine, batch_size=16)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    want = torch.stack([torch.cat([g.flatten() for g in grads]).norm()
                        for grads in per_example_grads(model, x, y)]).numpy()
    assert got.shape == (n,)
    assert got == pytest.approx(want, rel=1e-6)
    if name == "bk":   # the norms-only path gives the same bits as the clipped-sum path
        assert torch.equal(engine.example_norms(model, x[:9], y[:9]),
                           engine.clipped_sum(model, x[:9], y[:9], 1.0).per_example_norms)
