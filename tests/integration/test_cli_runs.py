"""The console script on bad input (one line, exit code 2, no traceback) and a run that diverges."""

from __future__ import annotations

import subprocess

import pytest
import sys

from raysim.cli import main
from tests.conftest import REPO

QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")


@pytest.mark.cluster   # a Python subprocess
def test_console_script_exit_code_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", QUICKSTART, "--set", "data.alpha=-1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "data.alpha" in proc.stderr


def test_diverged_run_is_reported_and_recorded(capsys, tmp_path):
    import pandas as pd
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path), "--set", "runtime.executor=serial",
                 "--set", "method=fedavg", "--set", "privacy.epsilon=null", "--set", "lr=1e30", "--set", "rounds=2"])
    err = capsys.readouterr().err
    assert code == 1 and "training diverged in round 1" in err
    runs = pd.read_parquet(tmp_path / "runs")
    assert runs["status"].tolist() == ["failed"] and "TrainingDiverged" in runs["error"].item()

