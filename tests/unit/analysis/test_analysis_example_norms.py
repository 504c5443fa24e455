"""plots.plot_clip_vs_example_norms and its place in the report, on small synthetic result tables.

The tables are built directly as DataFrames with the columns of raysim/results/schema.py plus the
two ADPC diagnostics ``example_norm_median`` (noised, read by the server) and
``example_norm_median_true`` (never uploaded), so these tests do not depend on whether the sink's
schema has those columns yet.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import plots, report
from analysis.load import Results
from raysim.results.schema import SCHEMAS

ROUNDS = (1, 2, 3)
CLIENTS = (0, 1, 2, 3)


def _frame(name: str, rows: list[dict], extra: tuple[str, ...] = ()) -> pd.DataFrame:
    columns = SCHEMAS[name].names + [c for c in extra if c not in SCHEMAS[name].names]
    return pd.DataFrame(rows, columns=columns)


def true_median(seed: int, rnd: int, client: int) -> float:
    return (1.0 + client) * (0.5 + seed) / rnd


def noised_median(seed: int, rnd: int, client: int) -> float:
    # client 0 of round 2 gets a large negative noise draw: a noised median can be ≤ 0
    return -3.0 if (rnd, client) == (2, 0) else true_median(seed, rnd, client) * 1.1


def clip(rnd: int) -> float:
    return 4.0 / rnd


def synthetic(runs_spec: list[tuple[str, str, int, str, bool]]) -> Results:
    """``runs_spec``: (run_id, method, seed, status, logs_example_norms) per run."""
    runs, rounds, clients = [], [], []
    for run_id, method, seed, status, logs in runs_spec:
        private = method != "fedavg"
        runs.append({
            "run_id": run_id, "method": method, "dataset": "digits", "partition": "dirichlet", "alpha": 0.5,
            "seed": seed, "num_clients": len(CLIENTS), "rounds": len(ROUNDS), "status": status,
            "rounds_completed": len(ROUNDS), "clipping": "auto" if private else "none", "delta": 1e-5,
            "config": json.dumps({"privacy": {"epsilon": 8.0 if private else None,
                                              "clipping": "auto" if private else "none"}}),
        })
        for r in ROUNDS:
            rounds.append({"run_id": run_id, "round": r, "test_accuracy": 0.5 + 0.1 * r, "test_f1": 0.4 + 0.1 * r,
                           "clip_norm": clip(r) if private else math.nan, "epsilon": 2.0 * r if private else math.inf})
            for c in CLIENTS:
                clients.append({"run_id": run_id, "round": r, "client_id": c, "num_samples": 50,
                                "example_norm_median": noised_median(seed, r, c) if logs else math.nan,
                                "example_norm_median_true": true_median(seed, r, c) if logs else math.nan})
    extra = ("example_norm_median", "example_norm_median_true")
    frames = _frame("runs", runs), _frame("rounds", rounds), _frame("clients", clients, extra), _frame("partitions", [])
    for f in frames:   # pandas gives object dtype to columns that are all None
        for col in f.columns:
            if f[col].dtype == object and f[col].isna().all():
                f[col] = f[col].astype(float)
    return Results(*frames)


MIXED = [("dim-s0", "feddimdp", 0, "completed", True), ("dim-s1", "feddimdp", 1, "running", True),
         ("dim-failed", "feddimdp", 2, "failed", True), ("avg-s0", "fedavg", 0, "completed", False)]


def assert_good_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert 300 <= width <= 4000 and 200 <= height <= 4000
    assert len(data) > 10_000   # lines, band and legend, not a blank canvas


@pytest.fixture()
def saved_figures(monkeypatch) -> list:
    """The Figure objects that plots._save writes, to check what was drawn."""
    figures: list = []
    original = plots._save

    def spy(fig, out_dir, name):
        figures.append(fig)
        return original(fig, out_dir, name)

    monkeypatch.setattr(plots, "_save", spy)
    return figures


def _lines(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {ln.get_label(): (np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float))
            for ln in ax.get_lines()}


def test_plot_writes_one_png_with_a_panel_per_logging_run(tmp_path, saved_figures):
    paths = plots.plot_clip_vs_example_norms(synthetic(MIXED), tmp_path)
    assert paths == [tmp_path / "clip_vs_example_norms.png"]
    assert_good_png(paths[0])

    (fig,) = saved_figures
    axes = [ax for ax in fig.axes if ax.get_visible()]
    # the failed run and the fedavg run (nothing logged) have no panel
    assert len(axes) == 2
    assert ["dim-s0" in axes[0].get_title(), "dim-s1" in axes[1].get_title()] == [True, True]
    for ax, seed in zip(axes, (0, 1)):
        assert "FedDimDP" in ax.get_title() and f"seed {seed}" in ax.get_title()
        assert ax.get_yscale() == "log"
        assert ax.get_xlabel() == "round" and ax.get_ylabel() == "gradient norm (l2)"
        lines = _lines(ax)
        assert ax.get_legend() is not None

        x, y = lines["clip norm C$^{(t)}$"]
        np.testing.assert_array_equal(x, ROUNDS)
        np.testing.assert_allclose(y, [clip(r) for r in ROUNDS])

        x, y = lines["true medians, median over clients"]
        np.testing.assert_array_equal(x, ROUNDS)
        np.testing.assert_allclose(y, [np.median([true_median(seed, r, c) for c in CLIENTS]) for r in ROUNDS])

        (label,) = [k for k in lines if k.startswith("private (noised) medians")]
        x, y = lines[label]
        np.testing.assert_array_equal(x, ROUNDS)   # the median over clients of round 2 is still > 0
        np.testing.assert_allclose(y, [np.median([noised_median(seed, r, c) for c in CLIENTS]) for r in ROUNDS])

        # the band spans min..max of the true medians over clients
        (band,) = ax.collections
        ys = band.get_paths()[0].vertices[:, 1]
        lo = min(true_median(seed, r, c) for r in ROUNDS for c in CLIENTS)
        hi = max(true_median(seed, r, c) for r in ROUNDS for c in CLIENTS)
        assert ys.min() == pytest.approx(lo) and ys.max() == pytest.approx(hi)


def test_plot_splits_many_runs_over_several_pngs(tmp_path, saved_figures):
    spec = [(f"dim-{s}", "feddimdp", s, "completed", True) for s in range(plots.EXAMPLE_NORM_PANELS + 1)]
    paths = plots.plot_clip_vs_example_norms(synthetic(spec), tmp_path)
    assert [p.name for p in paths] == ["clip_vs_example_norms_1.png", "clip_vs_example_norms_2.png"]
    for p in paths:
        assert_good_png(p)
    assert [sum(ax.get_visible() for ax in f.axes) for f in saved_figures] == [plots.EXAMPLE_NORM_PANELS, 1]


def test_plot_without_the_columns_raises(tmp_path):
    r = synthetic(MIXED)
    old = Results(r.runs, r.rounds, r.clients.drop(columns=["example_norm_median", "example_norm_median_true"]),
                  r.partitions)
    with pytest.raises(plots.NothingToPlot, match="no column example_norm_median_true"):
        plots.plot_clip_vs_example_norms(old, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("spec", [
    [("avg-s0", "fedavg", 0, "completed", False), ("dim-s0", "feddimdp", 0, "completed", False)],   # all null
    [("dim-failed", "feddimdp", 0, "failed", True), ("avg-s0", "fedavg", 0, "completed", False)],   # failed only
], ids=["all-null", "only-a-failed-run"])
def test_plot_with_null_diagnostic_raises(tmp_path, spec):
    with pytest.raises(plots.NothingToPlot, match="example_norm_median_true is null"):
        plots.plot_clip_vs_example_norms(synthetic(spec), tmp_path)
    assert not list(tmp_path.iterdir())


def test_report_includes_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "load_results", lambda folder: synthetic(MIXED))
    out = report.build_report(tmp_path / "results", tmp_path / "report")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "![Clip norm vs per-example gradient norms" in md
    assert "C^(t) against the spread of the clients' true (never uploaded) median per-example gradient norms" in md
    assert "ADPC sets C^(t+1) from the noised medians" in md
    assert_good_png(out / "figures" / "clip_vs_example_norms.png")
    assert '<img src="figures/clip_vs_example_norms.png"' in (out / "report.html").read_text(encoding="utf-8")


def test_report_notes_the_figure_when_not_logged(tmp_path, monkeypatch):
    r = synthetic(MIXED)
    old = Results(r.runs, r.rounds, r.clients.drop(columns=["example_norm_median", "example_norm_median_true"]),
                  r.partitions)
    monkeypatch.setattr(report, "load_results", lambda folder: old)
    out = report.build_report(tmp_path / "results", tmp_path / "report")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "- Clip norm vs per-example gradient norms (one panel per run): skipped — no run logged" in md
    assert "clip_vs_example_norms" not in md
    assert not (out / "figures" / "clip_vs_example_norms.png").exists()
