"""DP-ready backbones: ResNet-18 and WideResNet-16-4 with GroupNorm instead of BatchNorm.

BatchNorm normalises with statistics of the whole batch, so one example's output (and gradient)
depends on the others: per-example gradients are not defined and the clipping bound does not
bound one example's influence. GroupNorm normalises each example on its own.

Both backbones are written so that raysim's per-sample engine can run them: no ReLU or residual
addition modifies a layer's output in place (the math is that of the usual in-place versions).
torchvision is imported only inside :func:`resnet18_gn`, so that importing raysim.models stays cheap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raysim.models.lldm import LLDMBlock

__all__ = ["resnet18_gn", "wrn16_4", "GN_GROUPS_RESNET", "GN_GROUPS_WRN", "SMALL_INPUT_MAX"]

#: GroupNorm groups: 32 for ResNet-18 (Wu & He 2018), 16 for WRN-16-4 (whose stem has 16 channels).
GN_GROUPS_RESNET, GN_GROUPS_WRN = 32, 16
#: Inputs at most this large (CIFAR, SVHN, digits) get ResNet-18's CIFAR stem: a 3x3 stride-1 conv
#: and no max-pool, instead of the 7x7 stride-2 conv + max-pool meant for 224x224 images.
SMALL_INPUT_MAX = 64


def _lldm_block(channels: int, reduction: float | None, keep_fraction: float | None) -> LLDMBlock | None:
    return None if reduction is None else LLDMBlock(channels, reduction, keep_fraction)


def resnet18_gn(in_channels: int, image_size: int, num_classes: int, *, lldm_reduction: float | None = None,
                lldm_keep_fraction: float | None = None) -> nn.Module:
    """torchvision's ResNet-18 with GroupNorm(32, ·) in place of BatchNorm, out-of-place ReLU and
    residual additions, a stem for ``in_channels`` (CIFAR stem up to ``SMALL_INPUT_MAX`` pixels),
    and FedDimDP's LLDM block after the last stage (before global pooling) when ``lldm_reduction``."""
    from raysim.models.resnet_gn import ResNet18GN  # imports torchvision

    lldm = _lldm_block(512, lldm_reduction, lldm_keep_fraction)
    return ResNet18GN(in_channels, num_classes, GN_GROUPS_RESNET, small_input=image_size <= SMALL_INPUT_MAX,
                      lldm=lldm)


class _WideBlock(nn.Module):
    """Pre-activation wide residual block: GN-ReLU-conv3x3-GN-ReLU-conv3x3, 1x1 conv shortcut
    (on the activated input) when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(GN_GROUPS_WRN, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(GN_GROUPS_WRN, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu(self.norm1(x))
        out = self.conv2(F.relu(self.norm2(self.conv1(act))))
        return out + (x if self.shortcut is None else self.shortcut(act))


class WideResNet(nn.Module):
    """WideResNet-depth-k (Zagoruyko & Komodakis 2016) with GroupNorm; depth 16, k 4: ~2.7M parameters."""

    def __init__(self, in_channels: int, num_classes: int, depth: int = 16, widen: int = 4,
                 lldm_reduction: float | None = None, lldm_keep_fraction: float | None = None) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4, got {depth}")
        blocks = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        stages = []
        for stage, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:])):
            stride = 1 if stage == 0 else 2
            stages.append(nn.Sequential(*(_WideBlock(c_in if b == 0 else c_out, c_out, stride if b == 0 else 1)
                                          for b in range(blocks))))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.GroupNorm(GN_GROUPS_WRN, widths[-1])
        self.lldm = _lldm_block(widths[-1], lldm_reduction, lldm_keep_fraction)
        self.fc = nn.Linear(widths[-1] if self.lldm is None else self.lldm.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.stages(self.conv1(x))))
        if self.lldm is not None:
            x = self.lldm(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def wrn16_4(in_channels: int, image_size: int, num_classes: int, *, lldm_reduction: float | None = None,
            lldm_keep_fraction: float | None = None) -> nn.Module:
    """WideResNet-16-4 with GroupNorm(16, ·); any input size (global average pooling at the end)."""
    if image_size < 4:
        raise ValueError(f"wrn16_4 needs images of at least 4x4 pixels, got {image_size}")
    return WideResNet(in_channels, num_classes, 16, 4, lldm_reduction, lldm_keep_fraction)

