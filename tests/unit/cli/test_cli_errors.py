"""Bad input gets one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from raysim.cli import main
from tests.conftest import REPO

QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")


@pytest.mark.parametrize("args, fragment", [
    (["--set", "bogus=1"], "'bogus': unknown key"),
    (["--set", "method=fedmagic"], "unknown method 'fedmagic'"),
    (["--set", "data.name=mnist"], "unknown dataset 'mnist'"),
    (["--set", "data.alpha=0"], "'data.alpha': must be > 0"),
    (["--set", "num_clients=100000"], "more than the"),
    (["--set", "method=fedsa", "--set", "privacy.epsilon=null"], "needs privacy.epsilon"),
    (["--set", "method=fedavg", "--set", "privacy.clipping=none"], "drop one of them"),
    (["--set", "data.name=cifar10"], "--data-root"),
])
def test_run_user_errors(args, fragment, capsys, tmp_path):
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path), "--set", "runtime.executor=serial", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("raysim: error:")


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_results_dir_that_is_a_file_is_one_line_and_exit_2(command, capsys, tmp_path):
    not_a_folder = tmp_path / "results.txt"
    not_a_folder.write_text("a file, not a folder")
    config = QUICKSTART if command == "run" else str(REPO / "experiments" / "sweeps" / "smoke.yaml")
    code = main([command, config, "--results-dir", str(not_a_folder), "--set", "runtime.executor=serial"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a folder" in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("raysim: error:")


def test_missing_dataset_files_names_paths(capsys, tmp_path):
    code = main(["run", QUICKSTART, "--results-dir", str(tmp_path / "r"), "--data-root", str(tmp_path),
                 "--set", "data.name=svhn", "--set", "runtime.executor=serial"])
    err = capsys.readouterr().err
    assert code == 2 and str(tmp_path) in err and "train_32x32.mat" in err


def test_missing_config_file(capsys, tmp_path):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_methods_lists_registered(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("fedavg", "fedsa", "feddimdp", "feddimdp-no-cra", "feddimdp-no-adpc", "feddimdp-no-lldm"):
        assert f"\n{name} " in "\n" + out


@pytest.mark.parametrize("text, fragment", [
    ("base: {{}}\nmethods: [fedsa]\ntuning_seeds: [1]\nfinal_seeds: [1, 2]\n", "must be disjoint"),
    ("base: {quickstart}\nmethods: [fedmagic]\ntuning_seeds: [1]\nfinal_seeds: [2]\n", "unknown method 'fedmagic'"),
    ("base: {quickstart}\nmethods: [fedsa]\ntuning_seeds: [1]\nfinal_seeds: [2]\n", "data.server_holdout"),
    ("base: {quickstart}\nset: {{data.server_holdout: 100}}\nmethods: [fedsa]\nspace: {{lr: {{log: [0.1, 1]}}}}\n"
     "tuning_seeds: [1]\nfinal_seeds: [2]\n", "num >= 2"),
])
def test_tune_user_errors(text, fragment, capsys, tmp_path):
    path = tmp_path / "tune.yaml"
    path.write_text(text.format(quickstart=QUICKSTART))
    code = main(["tune", str(path), "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("raysim: error:")


def test_a_bug_keeps_its_traceback_and_says_it_is_a_bug(monkeypatch, capsys):
    # Only the project's input errors (ConfigError and its subclasses, missing files) are one line, exit 2;
    # any other exception, a ValueError included, is a bug: its traceback and a line saying so, exit 1.
    import raysim.cli.methods as methods

    def broken(args):
        raise ValueError("an internal invariant failed")
    monkeypatch.setattr(methods, "cmd_methods", broken)
    assert main(["methods"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: an internal invariant failed" in err
    assert "this is a bug in raysim" in err


def test_a_config_error_raised_inside_a_ray_task_is_still_one_line(monkeypatch, capsys):
    import raysim.cli.methods as methods
    from raysim.config import ConfigError

    class RemoteError(Exception):
        def __init__(self, cause):
            super().__init__("remote")
            self.cause = cause

    def remote(args):
        raise RemoteError(ConfigError("config key 'lr': must be > 0"))
    monkeypatch.setattr(methods, "cmd_methods", remote)
    assert main(["methods"]) == 2
    assert capsys.readouterr().err.strip() == "raysim: error: config key 'lr': must be > 0"
