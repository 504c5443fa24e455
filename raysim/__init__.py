"""raysim: Ray-parallel simulation of differentially private federated learning."""
__version__ = "0.1.0"
