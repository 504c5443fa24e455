"""docs/architecture.md's Python examples run as written (the plugin's files, marked ``# file:``, are
written and run end to end by tests/integration/test_plugins.py)."""

from __future__ import annotations

import re
import sys
import textwrap
import types

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "architecture.md"
BLOCKS = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
          if not b.startswith("# file: ")]


def test_the_page_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("code", BLOCKS, ids=lambda b: b.splitlines()[-1][:40])
def test_example_runs(code, monkeypatch):
    module = types.ModuleType("docs_example")   # a real module: dataclasses look their module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
