"""Where clients run. ``serial`` needs no Ray; the Ray modules are imported only when used.

This package is the only one in raysim that imports ray.
"""

from raysim.runtime.serial import SerialExecutor

__all__ = ["SerialExecutor"]
