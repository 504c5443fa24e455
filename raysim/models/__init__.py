"""Model factories: the paper's CNN and the GroupNorm backbones, by the config's ``model`` key."""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from raysim.config import MODEL_NAMES
from raysim.models.backbones import resnet18_gn, wrn16_4
from raysim.models.cnn import CNN, build_model, count_parameters, init_parameters
from raysim.config import ConfigError

__all__ = ["CNN", "build_model", "build_backbone", "count_parameters", "init_parameters", "model_for"]


def build_backbone(name: str, in_channels: int, image_size: int, num_classes: int, *, lldm: bool = False,
                   lldm_reduction: float = 0.5, lldm_keep_fraction: float = 0.5) -> nn.Module:
    """``name`` in ``MODEL_NAMES``; ``lldm=True`` inserts FedDimDP's LLDM block after the last conv
    block (for the residual nets: after the last stage, before global average pooling)."""
    if name == "cnn":
        return build_model(in_channels, image_size, num_classes, lldm=lldm, lldm_reduction=lldm_reduction,
                           lldm_keep_fraction=lldm_keep_fraction)
    builders = {"resnet18_gn": resnet18_gn, "wrn16_4": wrn16_4}
    if name not in builders:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return builders[name](in_channels, image_size, num_classes, lldm_reduction=lldm_reduction if lldm else None,
                          lldm_keep_fraction=lldm_keep_fraction if lldm else None)


def model_for(cfg: Any, info: Any, options: Mapping[str, Any] | None = None) -> nn.Module:
    """The client/global model of a run: ``cfg.model`` for ``info``'s inputs, built with the method's
    ``options`` (``MethodSpec.model_options(cfg)``, keyword options of :func:`build_backbone`)."""
    return build_backbone(cfg.model, info.channels, info.image_size, info.num_classes, **dict(options or {}))
