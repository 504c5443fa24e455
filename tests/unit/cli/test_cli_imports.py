"""Quick commands answer at once: ``raysim --help``, ``raysim privacy ...`` and importing raysim.config or
raysim.privacy.accounting load neither torch nor ray (nor pandas, pyarrow, matplotlib).

Each check runs in a fresh interpreter (the test process has most of these loaded already) that runs
the command as ``python -m raysim.cli`` does and then prints which top-level packages are in its
``sys.modules``; a command module that imports torch at the top, or a privacy package that pulls in
the DP-SGD code, shows up there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

#: Runs Python subprocesses: a ``make test-cluster`` test.
pytestmark = pytest.mark.cluster

HEAVY = {"torch", "ray", "pandas", "pyarrow", "matplotlib"}
ACCOUNTANT = {"dp_accounting", "scipy"}   # a second to import: `raysim --help` does without them

# Runs raysim.cli/__main__.py like `python -m raysim.cli ARGV...`, then reports the exit code and the
# top-level packages imported, as the last line of stdout.
RUN_CLI = """
import json, runpy, sys
sys.argv = ["raysim", *json.loads(sys.argv[1])]
code = 0
try:
    runpy.run_module("raysim.cli", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""

IMPORT = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps({"code": 0, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _child(code: str, arg: str) -> tuple[int, set[str], str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120)
    *output, last = proc.stdout.splitlines() or [""]
    assert proc.returncode == 0 and last.startswith("{"), proc.stdout + proc.stderr
    result = json.loads(last)
    return result["code"], set(result["loaded"]), "\n".join(output), proc.stderr


def _cli(*argv: str) -> tuple[int, set[str], str, str]:
    return _child(RUN_CLI, json.dumps(argv))


def test_help_imports_no_heavy_package_nor_the_accountant():
    code, loaded, out, _ = _cli("--help")
    assert code == 0 and out.startswith("usage: raysim")
    assert "raysim" in loaded   # the probe does see the child's imports
    assert loaded & (HEAVY | ACCOUNTANT) == set()


@pytest.mark.parametrize("argv, printed", [
    (["privacy", "epsilon", "--sample-rate", "0.04", "--noise-multiplier", "1.5", "--steps", "100",
      "--delta", "1e-5"], "epsilon = "),
    (["privacy", "calibrate", "--sample-rate", "0.04", "--target-epsilon", "2", "--steps", "100",
      "--delta", "1e-5"], "noise_multiplier = "),
])
def test_privacy_commands_import_neither_torch_nor_ray(argv, printed):
    code, loaded, out, _ = _cli(*argv)
    assert code == 0 and out.startswith(printed)
    assert "dp_accounting" in loaded   # the accountant did run in this child
    assert loaded & HEAVY == set()


def test_privacy_user_error_is_quick_too():
    # the error path must not import raysim.simulation (torch) to look for a diverged run
    code, loaded, _, err = _cli("privacy", "epsilon", "--sample-rate", "2", "--noise-multiplier", "1.5",
                                "--steps", "100", "--delta", "1e-5")
    assert code == 2 and err.strip() == "raysim: error: --sample-rate must be in (0, 1], got 2"
    assert loaded & (HEAVY | ACCOUNTANT) == set()


@pytest.mark.parametrize("module", ["raysim.config", "raysim.privacy.accounting", "raysim.cli"])
def test_light_modules_import_neither_torch_nor_ray(module):
    _, loaded, _, _ = _child(IMPORT, module)
    assert "raysim" in loaded
    assert loaded & HEAVY == set()
