"""Model factories by the config's ``model`` key: the paper's CNN, the GroupNorm backbones, LEAF's FEMNIST
CNN and the character LSTM of McMahan et al. 2017."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from torch import nn

from raysim.config import MODEL_NAMES, add_choice
from raysim.models.backbones import resnet18_gn, wrn16_4
from raysim.models.cnn import CNN, build_model, count_parameters, init_parameters, leaf_cnn, small_cnn
from raysim.models.lstm import char_lstm
from raysim.config import ConfigError

__all__ = ["CNN", "build_model", "build_backbone", "count_parameters", "init_parameters", "model_for",
           "register_model", "model_names"]

#: Models registered from outside raysim: name -> builder(in_channels, image_size, num_classes, **options).
_REGISTERED: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str, builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Make ``model: NAME`` build ``builder(in_channels, image_size, num_classes, **options)`` (``options``:
    the method's ``model_options``, empty for methods that do not change the model). Refuses a taken name."""
    if name in MODEL_NAMES or name in _REGISTERED:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTERED[name] = builder
    add_choice("model", name)
    return builder


def model_names() -> list[str]:
    return [*MODEL_NAMES, *_REGISTERED]


def build_backbone(name: str, in_channels: int, image_size: int, num_classes: int, *, lldm: bool = False,
                   lldm_reduction: float = 0.5, lldm_keep_fraction: float = 0.5) -> nn.Module:
    """``name`` in ``MODEL_NAMES``; ``lldm=True`` inserts FedDimDP's LLDM block after the last conv
    block (for the residual nets: after the last stage, before global average pooling). ``char_lstm``
    reads only ``num_classes`` (its vocabulary) and has no conv block for LLDM (ConfigError)."""
    if name in _REGISTERED:
        options = {"lldm": lldm, "lldm_reduction": lldm_reduction, "lldm_keep_fraction": lldm_keep_fraction}
        return _REGISTERED[name](in_channels, image_size, num_classes, **({} if not lldm else options))
    convnets = {"cnn": build_model, "small_cnn": small_cnn, "leaf_cnn": leaf_cnn}
    if name in convnets:
        return convnets[name](in_channels, image_size, num_classes, lldm=lldm, lldm_reduction=lldm_reduction,
                              lldm_keep_fraction=lldm_keep_fraction)
    if name == "char_lstm":
        if lldm:
            raise ConfigError("feddimdp.lldm: FedDimDP's LLDM block is a conv block and model char_lstm has none; "
                              "set feddimdp.lldm=false or use method feddimdp-no-lldm")
        return char_lstm(in_channels, image_size, num_classes)
    builders = {"resnet18_gn": resnet18_gn, "wrn16_4": wrn16_4}
    if name not in builders:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")
    return builders[name](in_channels, image_size, num_classes, lldm_reduction=lldm_reduction if lldm else None,
                          lldm_keep_fraction=lldm_keep_fraction if lldm else None)


def model_for(cfg: Any, info: Any, options: Mapping[str, Any] | None = None) -> nn.Module:
    """The client/global model of a run: ``cfg.model`` for ``info``'s inputs, built with the method's
    ``options`` (``MethodSpec.model_options(cfg)``, keyword options of :func:`build_backbone`)."""
    return build_backbone(cfg.model, info.channels, info.image_size, info.num_classes, **dict(options or {}))
