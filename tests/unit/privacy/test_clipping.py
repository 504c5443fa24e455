"""Clipping modes: noise scale and seeding, batch/none modes against hand computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from raysim.models.cnn import build_model
from raysim.privacy.clipping import CLIPPING_MODES, accounting_noise_multiplier, privatize
from raysim.privacy.grad_sample import SparseExamples, make_engine
from raysim.noise import GaussianNoise


def _setup(batch=8, seed=0, lldm=False):
    torch.manual_seed(0)
    model = build_model(1, 8, 10, lldm=lldm).double()  # ≈ 189k parameters: enough coordinates for a 2% std test
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return model, x, y


def _run(model, x, y, mode="per_sample", clip=0.5, sigma=1.0, expected=10, gen=None, per_layer=False):
    return privatize(model, x, y, mode=mode, clip_norm=clip, noise_multiplier=sigma, expected_batch_size=expected,
                     noise=gen, engine=make_engine("bk"), per_layer=per_layer)


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def _per_example_clipped_sum(model, x, y, clip):
    """Independent reference: loop over examples, clip each full gradient, sum."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum"), params)
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
        norms.append(norm)
        total = [t + g * min(1.0, clip / (norm + 1e-6)) for t, g in zip(total, grads)]
    return total, norms


def test_per_sample_without_noise_divides_clipped_sum_by_expected_batch_size():
    model, x, y = _setup()
    want, norms = _per_example_clipped_sum(model, x, y, 0.5)
    out = _run(model, x, y, sigma=0.0, expected=10)  # realised batch 8, expected 10
    for g, w in zip(out.grads, want):
        torch.testing.assert_close(g, w / 10, rtol=1e-5, atol=1e-9)
    assert out.batch_size == 8
    assert out.num_clipped == sum(n > 0.5 for n in norms)
    assert out.frac_clipped == pytest.approx(out.num_clipped / 8)
    assert out.loss_mean == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-9)


@pytest.mark.parametrize("per_layer", [False, True])
def test_per_sample_noise_std(per_layer):
    model, x, y = _setup()
    clip = [0.1, 0.2, 0.3, 0.4] if per_layer else 0.5
    sensitivity = math.sqrt(0.01 + 0.04 + 0.09 + 0.16) if per_layer else 0.5
    sigma, expected = 1.3, 16
    clean = _run(model, x, y, clip=clip, sigma=0.0, expected=expected, per_layer=per_layer)
    noisy = _run(model, x, y, clip=clip, sigma=sigma, expected=expected, gen=GaussianNoise(7, "dp_noise"),
                 per_layer=per_layer)
    noise = _flat(noisy.grads) - _flat(clean.grads)
    assert noise.numel() > 150_000  # std estimate error ≈ 1/sqrt(2n) ≈ 0.2%, far inside 2%
    want_std = sigma * sensitivity / expected
    assert float(noise.std()) == pytest.approx(want_std, rel=0.02)
    assert abs(float(noise.mean())) < 5 * want_std / math.sqrt(noise.numel())


def test_empty_batch_still_gets_noise():
    model, _, _ = _setup()
    x, y = torch.zeros(0, 1, 8, 8, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    out = _run(model, x, y, sigma=2.0, expected=16, gen=GaussianNoise(0, "dp_noise"))
    assert out.batch_size == 0 and out.num_clipped == 0 and out.frac_clipped == 0.0 and out.loss_mean == 0.0
    assert float(_flat(out.grads).std()) == pytest.approx(2.0 * 0.5 / 16, rel=0.02)


def test_seeding_same_different_and_explicit_generator_wins():
    model, x, y = _setup()
    torch.manual_seed(1)
    a = _flat(_run(model, x, y, gen=GaussianNoise(3, "dp_noise")).grads)
    torch.manual_seed(2)  # the global seed must not matter
    b = _flat(_run(model, x, y, gen=GaussianNoise(3, "dp_noise")).grads)
    c = _flat(_run(model, x, y, gen=GaussianNoise(4, "dp_noise")).grads)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_noise_without_generator_is_refused():
    model, x, y = _setup()
    with pytest.raises(ValueError, match="GaussianNoise"):
        _run(model, x, y, gen=None, sigma=1.0)
    _run(model, x, y, gen=None, sigma=0.0)  # no noise, no generator needed


def _mean_grad(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_batch_mode_clips_mean_gradient():
    model, x, y = _setup()
    mean = _mean_grad(model, x, y)
    norm = float(_flat(mean).norm())
    clip = norm / 3
    out = _run(model, x, y, mode="batch", clip=clip, sigma=0.0)
    for g, m in zip(out.grads, mean):
        torch.testing.assert_close(g, m * clip / (norm + 1e-6), rtol=1e-9, atol=1e-12)
    assert float(_flat(out.grads).norm()) == pytest.approx(clip, rel=1e-5)
    assert out.num_clipped == 8 and out.frac_clipped == 1.0

    unclipped = _run(model, x, y, mode="batch", clip=2 * norm, sigma=0.0)
    torch.testing.assert_close(_flat(unclipped.grads), _flat(mean), rtol=1e-12, atol=0)
    assert unclipped.num_clipped == 0 and unclipped.frac_clipped == 0.0


def test_batch_mode_noise_is_not_divided_by_batch_size():
    model, x, y = _setup()
    clean = _run(model, x, y, mode="batch", clip=0.1, sigma=0.0)
    noisy = _run(model, x, y, mode="batch", clip=0.1, sigma=0.8, gen=GaussianNoise(1, "dp_noise"))
    noise = _flat(noisy.grads) - _flat(clean.grads)
    assert float(noise.std()) == pytest.approx(0.8 * 0.1, rel=0.02)


def test_batch_mode_per_layer_thresholds():
    model, x, y = _setup()
    mean = _mean_grad(model, x, y)
    thresholds = [1e-3, 1e3, 1e-3, 1e3]
    out = _run(model, x, y, mode="batch", clip=thresholds, sigma=0.0, per_layer=True)
    for k, c in enumerate(thresholds):
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in mean[2 * k:2 * k + 2])))
        factor = min(1.0, c / (norm + 1e-6))
        for j in (2 * k, 2 * k + 1):
            torch.testing.assert_close(out.grads[j], mean[j] * factor, rtol=1e-9, atol=1e-15)


def test_none_mode_is_plain_mean_gradient():
    model, x, y = _setup(lldm=True)
    out = _run(model, x, y, mode="none", clip=1e-3, sigma=5.0, gen=None)
    torch.testing.assert_close(_flat(out.grads), _flat(_mean_grad(model, x, y)), rtol=1e-12, atol=0)
    assert out.num_clipped == 0 and out.frac_clipped == 0.0
    assert out.loss_mean == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-12)


def test_accounting_noise_multiplier_and_mode_validation():
    assert CLIPPING_MODES == ("per_sample", "batch", "none")
    assert accounting_noise_multiplier("per_sample", 1.2) == 1.2
    assert accounting_noise_multiplier("batch", 1.2) == pytest.approx(0.6)
    assert accounting_noise_multiplier("none", 1.2) == 0.0
    with pytest.raises(ValueError, match="privacy.clipping"):
        accounting_noise_multiplier("flat", 1.0)
    model, x, y = _setup(batch=2)
    with pytest.raises(ValueError, match="privacy.clipping"):
        _run(model, x, y, mode="per_layer")
    with pytest.raises(ValueError, match="expected_batch_size"):
        _run(model, x, y, expected=0, sigma=0.0)


@pytest.mark.parametrize("realised", [0, 3, 8, 20])
def test_per_sample_noise_does_not_depend_on_the_realised_batch_size(realised):
    """Dividing by |B_t| would scale the noise with the realised size (and leak it); no canary audit can
    see that bug, because it scales the canaries' signal the same way. Same generator, any |B_t|:
    the noise is bit for bit the same, N(0, (σC/B)²) with B the *expected* size."""
    model, x, y = _setup(batch=20)
    sigma, clip, expected = 1.3, 0.5, 10
    xb, yb = x[:realised], y[:realised]
    clean = _run(model, xb, yb, clip=clip, sigma=0.0, expected=expected)
    noisy = _run(model, xb, yb, clip=clip, sigma=sigma, expected=expected, gen=GaussianNoise(11, "dp_noise"))
    noise = _flat(noisy.grads) - _flat(clean.grads)
    reference = _run(model, x[:0], y[:0], clip=clip, sigma=sigma, expected=expected, gen=GaussianNoise(11, "dp_noise"))
    torch.testing.assert_close(noise, _flat(reference.grads), rtol=0, atol=1e-12)
    assert float(noise.std()) == pytest.approx(sigma * clip / expected, rel=0.02)


def _sparse_examples(params, k=3, entries=40):
    """k random sparse gradients on disjoint coordinates, and the same as dense (k, *shape) tensors."""
    gen = torch.Generator().manual_seed(3)
    sizes = torch.tensor([p.numel() for p in params])
    coords = torch.randperm(int(sizes.sum()), generator=gen)[:k * entries].view(k, entries)
    owner = torch.bucketize(coords, sizes.cumsum(0), right=True)
    sparse = SparseExamples(owner, coords - (sizes.cumsum(0) - sizes)[owner],
                            torch.randn(k, entries, generator=gen, dtype=torch.float64))
    dense = torch.zeros(k, int(sizes.sum()), dtype=torch.float64).scatter_(1, coords, sparse.values)
    return sparse, [e.view(k, *p.shape) for e, p in zip(dense.split(sizes.tolist(), dim=1), params)]


@pytest.mark.parametrize("engine", ["bk", "vmap"])
def test_extra_examples_are_clipped_with_the_batch_through_the_engine(engine):
    """The audit's canaries (``canaries``/``extra``): given by sparse gradients, clipped like examples."""
    model, x, y = _setup(batch=5)
    params = list(model.parameters())
    sparse, extra = _sparse_examples(params)
    assert len(set(sparse.param.flatten().tolist())) > 1
    extra_norms = torch.stack([torch.cat([e[c].flatten() for e in extra]).norm() for c in range(3)])
    assert (extra_norms > 0.5).all()                                  # all three must be clipped
    want, _ = _per_example_clipped_sum(model, x, y, 0.5)
    for c in range(3):
        want = [w + e[c] * (0.5 / (float(extra_norms[c]) + 1e-6)) for w, e in zip(want, extra)]
    out = privatize(model, x, y, mode="per_sample", clip_norm=0.5, noise_multiplier=0.0, expected_batch_size=10,
                    noise=None, engine=make_engine(engine), canaries=sparse)
    for g, w in zip(out.grads, want):
        torch.testing.assert_close(g, w / 10, rtol=1e-5, atol=1e-9)
    empty = privatize(model, x[:0], y[:0], mode="per_sample", clip_norm=0.5, noise_multiplier=0.0,
                      expected_batch_size=10, noise=None, engine=make_engine(engine), canaries=sparse)
    only = [sum(e[c] * (0.5 / (float(extra_norms[c]) + 1e-6)) for c in range(3)) / 10 for e in extra]
    for g, w in zip(empty.grads, only):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-9)


def test_batch_clipping_takes_the_extra_examples_into_the_mean_before_clipping():
    model, x, y = _setup(batch=5)
    params = list(model.parameters())
    sparse, extra = _sparse_examples(params)
    loss = F.cross_entropy(model(x), y, reduction="sum")
    mean = [(g + e.sum(0)) / 8 for g, e in zip(torch.autograd.grad(loss, params), extra)]
    norm = float(torch.cat([m.flatten() for m in mean]).norm())
    out = privatize(model, x, y, mode="batch", clip_norm=0.5, noise_multiplier=0.0, expected_batch_size=10,
                    noise=None, engine=make_engine("bk"), canaries=sparse)
    for g, m in zip(out.grads, mean):
        torch.testing.assert_close(g, m * min(1.0, 0.5 / (norm + 1e-6)), rtol=1e-6, atol=1e-12)
