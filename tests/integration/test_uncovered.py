"""Fail closed: an upload without noise is refused unless the config opts in by name, and with the opt-in
every place that prints ε prints the exception beside it."""

from __future__ import annotations

import pytest
import yaml

from raysim.cli import main
from raysim.config import ConfigError
from raysim.privacy.plan import resolve_clipping
from raysim.algorithms.registry import get_method, resolve_preset
from raysim.results import read_table
from raysim.runtime import execute
from tests.helpers import tiny_config

PLAIN_F1 = dict(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, feddimdp__adpc=False,
                cra__private_val_f1=False)


@pytest.mark.parametrize("changes, key", [
    (dict(cra__private_val_f1=False), "cra.local_val_f1"),
    (dict(method="dp-fedavg-adaptive", quantile__noise_multiplier=0.0), "quantile.unclipped_count"),
])
def test_an_uncovered_upload_is_refused_naming_the_key(changes, key):
    cfg = resolve_preset(tiny_config(**{"method": "feddimdp", "privacy__epsilon": 8.0, **changes}))
    with pytest.raises(ConfigError, match=rf"opt in with privacy.allow_uncovered: \[{key}\]"):
        resolve_clipping(get_method(cfg.method), cfg)
    allowed = resolve_preset(tiny_config(**{"method": "feddimdp", "privacy__epsilon": 8.0, **changes,
                                            "privacy__allow_uncovered": [key]}))
    assert resolve_clipping(get_method(allowed.method), allowed) == "per_sample"


def test_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys):
    config = tmp_path / "plain.yaml"
    config.write_text(yaml.safe_dump({"method": "feddimdp", "rounds": 1, "num_clients": 4, "batch_size": 32,
                                      "privacy": {"epsilon": 8.0}, "cra": {"private_val_f1": False},
                                      "data": {"name": "digits", "partition": "iid"},
                                      "runtime": {"executor": "serial"}}))
    assert main(["run", str(config), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "privacy.allow_uncovered: [cra.local_val_f1]" in err


def test_with_the_opt_in_epsilon_is_shown_with_its_exception(tmp_path, capsys):
    from analysis import load_results, summarise
    from raysim.cli.run import print_run_summary
    summary = execute(tiny_config(**PLAIN_F1, privacy__allow_uncovered=["cra.local_val_f1"]), str(tmp_path))
    runs = read_table(str(tmp_path), "runs")
    assert runs["epsilon_exceptions"].item() == "cra.local_val_f1"
    print_run_summary([summary.row], str(tmp_path))
    assert " except cra.local_val_f1" in capsys.readouterr().out
    assert "except cra.local_val_f1" in summarise(load_results(str(tmp_path)).runs)["privacy"].item()
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "except cra.local_val_f1" in md
    # a run without exceptions shows its bare ε
    other = execute(tiny_config(method="fedsa", rounds=1, privacy__noise_multiplier=1.0), str(tmp_path / "fedsa"))
    assert read_table(str(tmp_path / "fedsa"), "runs")["epsilon_exceptions"].item() == ""
    print_run_summary([other.row], str(tmp_path))
    assert "except" not in capsys.readouterr().out
