"""analysis/ and `raysim report` on results that real (tiny, serial) runs wrote.

One module-scoped sweep: FedAvg (no DP) seeds 0 and 1, a FedAvg run interrupted after its first
of 3 rounds (a report is taken while it is still running, then it fails), and FedDimDP at ε = 8.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis import load_results, summarise, table1, table2
from analysis import plots
from analysis.load import Results
from analysis.paper import PAPER_TABLE1, PAPER_TABLE2
from analysis.tables import MISSING
from raysim.cli import main
from raysim.runtime import execute
from raysim.results.schema import SCHEMAS
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation

PAPER_ROWS = ["DP-FedSAM", "DP-ACDN", "FedACG", "AWDP-FL", "FedSA", "FedDimDP"]
ABLATION_ROWS = ["FedDimDP", "FedDimDP w/o-CRA", "FedDimDP w/o-ADPC", "FedDimDP w/o-LLDM"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("sweep")
    fedavg = [execute(tiny_config(method="fedavg", seed=s), str(folder)).run_id for s in (0, 1)]

    def on_round(rec) -> None:
        # the run's row says "running" with 1 of 3 rounds: report on it as a live sweep would,
        # into the default --out (RESULTS_DIR/report)
        assert main(["report", str(folder)]) == 0
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(tiny_config(method="fedavg", seed=7, rounds=3), str(folder), on_round=on_round)
    dimdp = execute(tiny_config(method="feddimdp", privacy__epsilon=8), str(folder)).run_id
    runs = pd.read_parquet(folder / "runs")
    failed = runs.loc[runs["status"] == "failed", "run_id"].tolist()
    return SimpleNamespace(folder=str(folder), fedavg=fedavg, feddimdp=dimdp, failed=failed,
                           running_report=folder / "report")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_good_png(path: Path) -> None:
    assert path.is_file() and path.suffix == ".png"
    width, height = png_size(path)
    assert 300 <= width <= 4000 and 200 <= height <= 4000
    assert path.stat().st_size > 10_000   # text, lines and legends, not a blank canvas


def test_load_results_shapes(sweep):
    r = load_results(sweep.folder)
    for name in ("runs", "rounds", "clients", "partitions"):
        assert list(getattr(r, name).columns) == SCHEMAS[name].names
    assert len(r.runs) == 4 and len(sweep.failed) == 1
    assert sorted(r.runs["status"]) == ["completed", "completed", "completed", "failed"]
    # 2 rounds for each completed run, 1 for the interrupted one; 4 clients per round
    assert len(r.rounds) == 2 * 3 + 1
    assert r.rounds.groupby("run_id").size().to_dict() == {**{i: 2 for i in sweep.fedavg + [sweep.feddimdp]},
                                                           sweep.failed[0]: 1}
    assert len(r.clients) == 4 * len(r.rounds)
    assert set(r.partitions["run_id"]) == set(r.runs["run_id"])
    # partition table (train split) and the clients' training sizes are written by different code paths
    train = r.partitions[r.partitions["split"] == "train"].groupby(["run_id", "client_id"])["count"].sum()
    sizes = r.clients[r.clients["round"] == 1].set_index(["run_id", "client_id"])["num_samples"]
    pd.testing.assert_series_equal(train.sort_index(), sizes.sort_index(), check_names=False, check_dtype=False)


def test_load_results_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_results(tmp_path / "nope")


def test_summarise_matches_direct_pandas(sweep):
    r = load_results(sweep.folder)
    s = summarise(r.runs).set_index("method")
    assert set(s.index) == {"fedavg", "feddimdp"}   # the failed run is not summarised
    done = r.runs[r.runs["status"] == "completed"]
    for method, g in done.groupby("method"):
        row = s.loc[method]
        assert row["n_seeds"] == len(g)
        assert row["accuracy_mean"] == pytest.approx(g["final_test_accuracy"].mean())
        assert row["f1_mean"] == pytest.approx(g["final_test_f1"].mean())
        if len(g) > 1:
            assert row["accuracy_std"] == pytest.approx(np.std(g["final_test_accuracy"].to_numpy(), ddof=1))
            assert row["f1_std"] == pytest.approx(np.std(g["final_test_f1"].to_numpy(), ddof=1))
        else:
            assert math.isnan(row["accuracy_std"])
    # final accuracy from the runs table equals the last round of the rounds table
    last = r.rounds.sort_values("round").groupby("run_id").last()
    fedavg_last = last.loc[sweep.fedavg, "test_accuracy"]
    assert s.loc["fedavg", "accuracy_mean"] == pytest.approx(fedavg_last.mean())
    assert s.loc["fedavg", "seeds"] == "0,1" and s.loc["fedavg", "n_configs"] == 1
    assert s.loc["fedavg", "privacy"] == "no DP" and s.loc["feddimdp", "privacy"] == "ε=8 (per-client)"
    assert s.loc["feddimdp", "epsilon_mean"] == pytest.approx(8.0, rel=1e-3)


def test_table1_layout_and_paper_columns(sweep):
    r = load_results(sweep.folder)
    t = table1(r.runs)
    assert list(t.index) == PAPER_ROWS + ["FedAvg"]
    assert list(t.columns) == ["CIFAR-10 — ours", "CIFAR-10 — paper (claimed)", "SVHN — ours", "SVHN — paper (claimed)",
                               "STL-10 — ours", "STL-10 — paper (claimed)", "digits — ours"]
    assert t.notna().all().all()
    assert t.loc["FedDimDP", "CIFAR-10 — paper (claimed)"] == "0.811 / 0.809"
    assert t.loc["DP-FedSAM", "SVHN — paper (claimed)"] == "0.786 / 0.860"
    for row, method in zip(PAPER_ROWS, PAPER_TABLE1):
        acc, f1 = PAPER_TABLE1[method]["stl10"]
        assert t.loc[row, "STL-10 — paper (claimed)"] == f"{acc:.3f} / {f1:.3f}"
    # nothing was run on the paper's datasets, and the paper has no FedAvg row: never invented
    assert (t[["CIFAR-10 — ours", "SVHN — ours", "STL-10 — ours"]] == MISSING).all().all()
    assert (t.loc["FedAvg", [c for c in t.columns if "paper" in c]] == MISSING).all()
    assert (t.loc[PAPER_ROWS[:-1], "digits — ours"] == MISSING).all()
    done = r.runs[r.runs["status"] == "completed"]
    dim = done[done["method"] == "feddimdp"].iloc[0]
    assert t.loc["FedDimDP", "digits — ours"] == f"{dim.final_test_accuracy:.3f} / {dim.final_test_f1:.3f} (n=1)"
    fedavg = done[done["method"] == "fedavg"]
    expected = (f"{fedavg.final_test_accuracy.mean():.3f} ± {fedavg.final_test_accuracy.std():.3f} / "
                f"{fedavg.final_test_f1.mean():.3f} ± {fedavg.final_test_f1.std():.3f} (n=2)")
    assert t.loc["FedAvg", "digits — ours"] == expected


def test_table2_ablation_layout(sweep):
    t = table2(load_results(sweep.folder).runs)
    assert list(t.index) == ABLATION_ROWS   # other methods are not part of the ablation table
    for row, method in zip(ABLATION_ROWS, PAPER_TABLE2):
        acc, f1 = PAPER_TABLE2[method]["cifar10"]
        assert t.loc[row, "CIFAR-10 — paper (claimed)"] == f"{acc:.3f} / {f1:.3f}"
    assert t.loc["FedDimDP w/o-CRA", "SVHN — paper (claimed)"] == "0.863 / 0.848"
    assert t.loc["FedDimDP", "digits — ours"].endswith("(n=1)")
    assert (t.loc[ABLATION_ROWS[1:], "digits — ours"] == MISSING).all()


def test_plots_write_pngs(sweep, tmp_path):
    r = load_results(sweep.folder)
    metrics = plots.plot_metrics_per_round(r, tmp_path)
    assert len(metrics) == 1   # one dataset setting
    paths = metrics + [plots.plot_clip_norm(r, tmp_path), plots.plot_robust_weights(r, tmp_path),
                       plots.plot_epsilon_vs_accuracy(r, tmp_path), plots.plot_partition(r, tmp_path)]
    for p in paths:
        assert_good_png(Path(p))
    assert sweep.feddimdp in Path(paths[2]).name   # the heatmap is of the feddimdp run


def test_plots_without_data_say_why(sweep, tmp_path):
    r = load_results(sweep.folder)
    fedavg_only = Results(*(t[t["run_id"].isin(sweep.fedavg)] for t in (r.runs, r.rounds, r.clients, r.partitions)))
    with pytest.raises(plots.NothingToPlot, match="robust weights"):
        plots.plot_robust_weights(fedavg_only, tmp_path)
    with pytest.raises(plots.NothingToPlot, match="clip norm"):
        plots.plot_clip_norm(fedavg_only, tmp_path)   # non-private runs have no meaningful C
    assert_good_png(plots.plot_epsilon_vs_accuracy(fedavg_only, tmp_path))   # ε = ∞ drawn as a line


def test_report_cli(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", sweep.folder, "--out", str(out)]) == 0
    assert str(out / "report.md") in capsys.readouterr().out
    md = (out / "report.md").read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    # the interrupted run is listed with its status, rounds and error
    failed = sweep.failed[0]
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {failed} | fedavg | failed"))
    assert "| 1/3 |" in line and "KeyboardInterrupt" in line
    # ε/δ of each run and what the accountant does not cover
    assert "logged by the simulation only, never uploaded" in md and "everything (no DP)" in md
    dim_line = next(ln for ln in md.splitlines() if ln.startswith(f"| {sweep.feddimdp} | feddimdp | completed"))
    assert "| 8 (per-client) | 1e-05 |" in dim_line
    assert "paper (claimed)" in md and "Table II" in md
    # figures: relative paths that exist, in both documents
    images = [ln.split("](")[1].rstrip(")") for ln in md.splitlines() if ln.startswith("![")]
    # the per-run C^(t) vs example-norm figure is drawn only if the feddimdp run logged the ADPC
    # diagnostic clients.example_norm_median_true (test_analysis_example_norms.py covers it)
    example_norms = [i for i in images if Path(i).name.startswith("clip_vs_example_norms")]
    clients = load_results(sweep.folder).clients
    logged = "example_norm_median_true" in clients and clients["example_norm_median_true"].notna().any()
    assert len(example_norms) == (1 if logged else 0)
    assert len(images) - len(example_norms) == 5
    for rel in images:
        assert not os.path.isabs(rel)
        assert_good_png(out / rel)
        assert f'<img src="{rel}"' in html
    assert html.startswith("<!DOCTYPE html>") and "<table" in html and failed in html
    summary = pd.read_csv(out / "summary.csv")
    expected = summarise(load_results(sweep.folder).runs)
    assert list(summary.columns) == list(expected.columns)
    np.testing.assert_allclose(summary["accuracy_mean"], expected["accuracy_mean"])


def test_report_on_running_sweep(sweep):
    md = (Path(sweep.running_report) / "report.md").read_text(encoding="utf-8")
    assert "| 1/3 |" in md and "| running |" in md
    assert "running" in md.splitlines()[2]   # the headline counts
    # no feddimdp run yet at that point: the heatmap is skipped with a note, not a crash
    assert "CRA robust weights per client and round: skipped" in md
    assert (Path(sweep.running_report) / "summary.csv").is_file()   # the default --out
    assert (Path(sweep.running_report) / "report.html").is_file()


def test_report_without_runs_is_one_line_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim: error: no runs in") and "\n" not in err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.cluster   # a Python subprocess
def test_analysis_never_imports_ray():
    code = ("import sys, analysis, analysis.plots, analysis.report, raysim.cli.report; "
            "sys.exit(1 if 'ray' in sys.modules else 0)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_report_shows_tuned_and_fixed_tables_chosen_values_privacy_cost_and_lr_plot(sweep, tmp_path):
    import shutil

    from raysim.results import ResultsSink
    from raysim.tune import Candidate, choose, final_runs, parse_tune, search_runs, tuning_rows
    folder = tmp_path / "results"
    shutil.copytree(sweep.folder, folder, ignore=shutil.ignore_patterns("report"))
    tune = parse_tune({"base": {"rounds": 2, "num_clients": 4, "privacy": {"epsilon": 8.0},
                                "data": {"name": "digits", "server_holdout": 100}},
                       "methods": ["fedsa", "feddimdp"], "space": {"lr": [0.05, 0.1, 0.2]},
                       "tuning_seeds": [10, 11], "final_seeds": [0, 1, 2], "reference": "fedsa"}, name="t")
    search = search_runs(tune)
    fake = {r.run_id: {"status": "completed", "final_val_accuracy": r.cfg.lr * (2 if r.contestant == "fedsa" else 1),
                       "final_test_accuracy": 0.5 + r.cfg.lr + 0.01 * r.seed, "final_test_f1": 0.4, "epsilon": 8.0}
            for r in search}
    chosen = choose(tune, search, fake)
    assert chosen == {"fedsa": Candidate((("lr", 0.2),)), "feddimdp": Candidate((("lr", 0.2),))}
    final = final_runs(tune, chosen)
    fake.update({r.run_id: {"status": "completed", "final_val_accuracy": 0.5,
                            "final_test_accuracy": 0.6 + 0.01 * r.seed + (0.05 if r.contestant == "feddimdp" else 0),
                            "final_test_f1": 0.5, "epsilon": 8.0} for r in final})
    runs = search + final
    ResultsSink(str(folder)).write_tuning("t-1", tuning_rows(tune, "t-1", runs, fake,
                                                             {r.run_id for r in runs if chosen[r.contestant] == r.candidate}))
    assert main(["report", str(folder), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Tuned comparisons" in md and "paired Δ vs fedsa" in md
    assert "+0.0500 [+0.0500, +0.0500]" in md         # feddimdp is 0.05 above fedsa on every seed
    assert "not included" in md and "6 candidate configurations" in md and "12 training runs" in md
    assert "lr=0.2" in md
    assert "At the edge of the search space: fedsa: the chosen lr=0.2 is the largest of the 3 values" in md
    assert (tmp_path / "rep" / "figures" / "tuning_t-1.png").exists()
