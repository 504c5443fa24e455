"""DP noise in blocks (raysim.noise): the same bits at any thread count, block b from the b-th
generator of the key, and the spin-count setting of the processes raysim starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from raysim.noise import BLOCK, GaussianNoise, _runs
from raysim.rng import torch_generator, torch_generators

SHAPES = [(BLOCK - 3,), (4, 5), (2 * BLOCK + 7,), (3,)]     # blocks straddle tensors


def _draw(threads: int, shapes=SHAPES, std: float = 0.5) -> list[torch.Tensor]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return GaussianNoise(3, "dp-noise", 2, 7, 11, 0).like([torch.empty(s) for s in shapes], std)
    finally:
        torch.set_num_threads(before)


def test_the_bits_do_not_depend_on_the_thread_count():
    one, two, again = _draw(1), _draw(2), _draw(2)
    assert [t.shape for t in one] == [torch.Size(s) for s in SHAPES]
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    assert all(torch.equal(a, b) for a, b in zip(two, again))


def test_block_b_is_the_bth_generator_of_the_key_over_the_flattened_tensors():
    flat = torch.cat([t.view(-1) for t in _draw(2)])
    gens = torch_generators(4, 3, "dp-noise", 2, 7, 11, 0)
    # (block, piece length): each tensor's part of a block is drawn on its own, in order
    pieces = [(0, BLOCK - 3), (0, 3),                 # tensor 0, then the first 3 of the (4, 5) tensor
              (1, 17), (1, BLOCK - 17),               # the rest of (4, 5), then the long tensor
              (2, BLOCK),
              (3, 24), (3, 3)]                        # the long tensor's last 24, then the (3,) tensor
    expected = torch.cat([torch.empty(n).normal_(0.0, 0.5, generator=gens[b]) for b, n in pieces])
    assert torch.equal(flat, expected)


def test_noise_within_one_block_is_the_keys_generator_draw_and_generators_extend_the_same_stream():
    small = GaussianNoise(1, "server-dp-noise", 4).vector(1000, 2.0)
    assert torch.equal(small, torch.empty(1000).normal_(0.0, 2.0, generator=torch_generator(1, "server-dp-noise", 4)))
    a, b = torch_generators(3, 1, "x", 2), torch_generators(5, 1, "x", 2)
    assert [g.initial_seed() for g in a] == [g.initial_seed() for g in b[:3]]
    assert a[0].initial_seed() == torch_generator(1, "x", 2).initial_seed()
    assert len({g.initial_seed() for g in b}) == 5


def test_scale_zero_and_distribution():
    assert all(not t.any() for t in GaussianNoise(0, "p").like([torch.empty(5, 5)], 0.0))
    assert [t.shape for t in GaussianNoise(0, "p").like([torch.empty(0), torch.empty(3, 0)], 1.0)] == [(0,), (3, 0)]
    v = GaussianNoise(0, "p").vector(3 * BLOCK, 1.5).double()
    assert abs(float(v.mean())) < 0.01
    assert abs(float(v.std()) - 1.5) < 0.01
    blocks = v.view(3, BLOCK)
    assert not torch.equal(blocks[0], blocks[1])                       # the blocks' streams differ
    assert abs(float((blocks[0] * blocks[1]).mean())) < 0.05 * 1.5 ** 2


@pytest.mark.parametrize("sizes,parts", [([BLOCK] * 4 + [5], 2), ([1], 4), ([3, 1, 1, 1], 2), ([1] * 7, 3)])
def test_runs_cover_the_blocks_in_order_and_balance_them(sizes, parts):
    runs = _runs(sizes, parts)
    assert [i for r in runs for i in r] == list(range(len(sizes)))
    assert 1 <= len(runs) <= min(parts, len(sizes)) and all(len(r) for r in runs)
    loads = [sum(sizes[i] for i in r) for r in runs]
    assert max(loads) - min(loads) <= max(sizes)


@pytest.mark.parametrize("preset,torch_first,expected", [(None, False, "10000"), ("5", False, "5"),
                                                         (None, True, None)])
def test_spin_less_sets_the_spin_count_only_before_torch_loads_and_never_over_the_users(preset, torch_first, expected):
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if preset is not None:
        env["GOMP_SPINCOUNT"] = preset
    code = ("import os\n" + ("import torch\n" if torch_first else "")
            + "from raysim.allocator import spin_less\nspin_less()\nprint(os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


def test_the_raysim_command_sets_the_spin_count_before_its_command_runs():
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    code = ("import os, raysim.cli\ntry:\n    raysim.cli.main(['methods'])\nfinally:\n"
            "    print('SPIN', os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "SPIN 10000", out.stdout[-500:] + out.stderr[-500:]
