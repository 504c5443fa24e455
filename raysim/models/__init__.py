"""Model factories."""

from __future__ import annotations

from typing import Any

from raysim.models.cnn import CNN, build_model, count_parameters, init_parameters

__all__ = ["CNN", "build_model", "count_parameters", "init_parameters", "model_for"]


def model_for(cfg: Any, info: Any, lldm: bool) -> CNN:
    """The client/global model of a run: the paper's CNN for ``info``'s inputs, with FedDimDP's LLDM
    block when ``lldm`` (reduction and keep fraction from ``cfg.lldm``)."""
    return build_model(info.channels, info.image_size, info.num_classes, lldm=lldm,
                       lldm_reduction=cfg.lldm.reduction, lldm_keep_fraction=cfg.lldm.keep_fraction)
