"""Imports every built-in method module so that each registers itself."""

from raysim.algorithms import fedavg  # noqa: F401
from raysim.algorithms import feddimdp  # noqa: F401
from raysim.algorithms import acdn  # noqa: F401
from raysim.algorithms import awdp  # noqa: F401
from raysim.algorithms import fedacg  # noqa: F401
from raysim.algorithms import fedprox  # noqa: F401
from raysim.algorithms import quantile  # noqa: F401
from raysim.algorithms import sam  # noqa: F401
from raysim.algorithms import scaffold  # noqa: F401
