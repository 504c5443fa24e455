"""ResNet-18 with GroupNorm on torchvision's ResNet; imported only by ``backbones.resnet18_gn``
(this module imports torchvision)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from raysim.models.lldm import LLDMBlock


class OutOfPlaceBasicBlock(BasicBlock):
    """torchvision's BasicBlock computing ``relu(out + identity)`` out of place, where the original
    does ``out += identity; relu_(out)``: the same numbers, with every layer's output left intact
    (the per-sample engine reads the outputs of the norm layers after the forward pass)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet18GN(ResNet):
    """``torchvision.models.resnet18`` (BasicBlock, [2, 2, 2, 2]) with ``GroupNorm(groups, ·)`` as the
    norm layer and an out-of-place ReLU. ``small_input``: the CIFAR stem (3x3 stride-1 conv, no
    max-pool). ``lldm``: applied to the last stage's feature map before global average pooling."""

    def __init__(self, in_channels: int, num_classes: int, groups: int, *, small_input: bool,
                 lldm: LLDMBlock | None = None) -> None:
        super().__init__(OutOfPlaceBasicBlock, [2, 2, 2, 2], num_classes=num_classes,
                         norm_layer=partial(nn.GroupNorm, groups))  # picklable, unlike a lambda
        self.relu = nn.ReLU()
        if small_input:
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif in_channels != 3:
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.lldm = lldm
        if lldm is not None:
            self.fc = nn.Linear(lldm.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        if self.lldm is not None:
            x = self.lldm(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))
