"""Imports every built-in method module so that each registers itself."""

from raysim.algorithms import fedavg  # noqa: F401
from raysim.algorithms import feddimdp  # noqa: F401
