"""The paper's backbone (reconstructed; docs/methods.md, "Backbones"): 2 conv + 2 FC, shaped by the input.

``Conv(c→32, 5x5, pad 2) → ReLU → MaxPool2 → Conv(32→64, 5x5, pad 2) → ReLU → MaxPool2
→ [LLDM: 1x1 conv 64→⌈r·64⌉ (no bias) → ReLU → top-k gradient sparsifier] → flatten
→ FC(·→512) → ReLU → FC(512→num_classes)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from raysim.models.lldm import TopKGradSparsifier


#: Width of the dense layer of LEAF's FEMNIST CNN (:func:`leaf_cnn`).
LEAF_HIDDEN = 2048


class _ConvNet(nn.Module):
    """A conv stack, optionally FedDimDP's LLDM block after its last conv, and two dense layers."""

    reduce: nn.Conv2d | None
    sparsify: TopKGradSparsifier | None

    def _add_lldm(self, channels: int, lldm_reduction: float | None, lldm_keep_fraction: float | None) -> int:
        """Registers the LLDM block (1x1 conv to ⌈r·channels⌉, ReLU, top-k gradient sparsifier) when
        ``lldm_reduction`` is given; returns the channels the dense layers read."""
        self.reduce = None
        self.sparsify = None
        if lldm_reduction is None:
            return channels
        if not 0.0 < lldm_reduction <= 1.0:
            raise ValueError(f"lldm.reduction must be in (0, 1], got {lldm_reduction}")
        reduced = math.ceil(lldm_reduction * channels)
        self.reduce = nn.Conv2d(channels, reduced, kernel_size=1, bias=False)
        if lldm_keep_fraction is not None:
            self.sparsify = TopKGradSparsifier(lldm_keep_fraction)
        return reduced

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        """The LLDM block (if any), then ``fc1`` → ReLU → ``fc2`` on the flattened features."""
        if self.reduce is not None:
            x = torch.relu(self.reduce(x))
            if self.sparsify is not None:
                x = self.sparsify(x)
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(_ConvNet):
    """Backbone CNN, optionally with the LLDM block of FedDimDP after the last conv block.

    Only ``Conv2d`` and ``Linear`` layers carry parameters, which is what raysim's per-sample
    gradient engine supports.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int,
                 lldm_reduction: float | None = None, lldm_keep_fraction: float | None = None,
                 hidden: int = 512) -> None:
        super().__init__()
        if image_size % 4 != 0:
            raise ValueError(f"image_size must be divisible by 4 (two 2x2 pools), got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.pool = nn.MaxPool2d(2)
        channels = self._add_lldm(64, lldm_reduction, lldm_keep_fraction)
        spatial = image_size // 4
        self.fc1 = nn.Linear(channels * spatial * spatial, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self._classify(x)


def _lldm_args(lldm: bool, lldm_reduction: float, lldm_keep_fraction: float) -> tuple[float | None, float | None]:
    """The LLDM arguments of a conv net's constructor: ``(reduction, keep fraction)``, or none of it."""
    return (lldm_reduction, lldm_keep_fraction) if lldm else (None, None)


def build_model(in_channels: int, image_size: int, num_classes: int, *, lldm: bool = False,
                lldm_reduction: float = 0.5, lldm_keep_fraction: float = 0.5) -> CNN:
    """CNN factory. ``lldm=True`` adds FedDimDP's channel reduction and gradient sparsifier."""
    return CNN(in_channels, image_size, num_classes, *_lldm_args(lldm, lldm_reduction, lldm_keep_fraction))


def leaf_cnn(in_channels: int, image_size: int, num_classes: int, *, lldm: bool = False,
             lldm_reduction: float = 0.5, lldm_keep_fraction: float = 0.5) -> CNN:
    """LEAF's FEMNIST CNN (Caldas et al. 2018): the same two 5x5 'same' conv blocks (32 and 64 channels,
    ReLU, 2x2 max-pool) with a 2048-unit dense layer; 6,603,710 parameters for 28x28x1 input and 62 classes."""
    return CNN(in_channels, image_size, num_classes, *_lldm_args(lldm, lldm_reduction, lldm_keep_fraction),
               hidden=LEAF_HIDDEN)


class SmallCNN(_ConvNet):
    """A small CNN for cross-device studies, where the server's client-level noise grows with √d:
    three 3x3 'valid' convs (32, 64, 64 channels, ReLU, 2x2 max-pool after the first two), a 64-unit
    dense layer and the classifier (the layout of TensorFlow's CIFAR-10 tutorial CNN); 122,570
    parameters for 32x32x3 inputs and 10 classes. ``lldm_reduction`` inserts FedDimDP's LLDM block after
    the last conv, as in :class:`CNN`."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int,
                 lldm_reduction: float | None = None, lldm_keep_fraction: float | None = None) -> None:
        super().__init__()
        spatial = ((image_size - 2) // 2 - 2) // 2 - 2
        if spatial < 1:
            raise ValueError(f"small_cnn needs inputs of at least 18 px, got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.pool = nn.MaxPool2d(2)
        channels = self._add_lldm(64, lldm_reduction, lldm_keep_fraction)
        self.fc1 = nn.Linear(channels * spatial * spatial, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self._classify(torch.relu(self.conv3(x)))


def small_cnn(in_channels: int, image_size: int, num_classes: int, *, lldm: bool = False,
              lldm_reduction: float = 0.5, lldm_keep_fraction: float = 0.5) -> SmallCNN:
    """:class:`SmallCNN`; ``lldm=True`` adds FedDimDP's channel reduction and gradient sparsifier."""
    return SmallCNN(in_channels, image_size, num_classes, *_lldm_args(lldm, lldm_reduction, lldm_keep_fraction))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default Conv2d/Linear initialisation, drawn from an explicit generator.

    (kaiming-uniform with a=√5 for weights, U(±1/√fan_in) for biases), so the initial global
    model depends only on the run's seed, never on the global RNG; GroupNorm: weight 1, bias 0;
    Embedding: N(0, 1), its padding row 0. A module with an ``init_from(generator)`` method (an LSTM
    layer, ``raysim.models.lstm``) initialises itself and everything in it. Any other parametrised
    module is refused, so that no parameter keeps a global-RNG draw.
    """
    done: set[int] = set()
    for module in model.modules():
        if id(module) in done:
            continue
        if callable(getattr(module, "init_from", None)):
            module.init_from(generator)
            done.update(id(m) for m in module.modules())
            continue
        own = list(module.parameters(recurse=False))
        if own and not isinstance(module, (nn.Conv2d, nn.Linear, nn.GroupNorm, nn.Embedding)):
            raise ValueError(f"init_parameters cannot initialise a {type(module).__name__} from a generator")
        if isinstance(module, nn.GroupNorm) and module.affine:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, generator=generator)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
            if module.bias is not None:
                fan_in = module.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(module.bias, -bound, bound, generator=generator)
