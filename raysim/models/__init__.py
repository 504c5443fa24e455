"""Model factories."""

from raysim.models.cnn import CNN, build_model, count_parameters, init_parameters

__all__ = ["CNN", "build_model", "count_parameters", "init_parameters"]
