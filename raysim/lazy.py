"""A module imported on its first attribute access, for heavy imports that some processes never use."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module ``name`` and imports it when an attribute is first read.

    dp_accounting and SciPy take 1.1–1.6 s to import on the 2-core VM (docs/performance.md). A
    ``raysim run`` process that only plans and writes rows, and a driver actor of a run without DP,
    never call them, and each such second is on the way to round 1.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)
