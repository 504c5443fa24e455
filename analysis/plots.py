"""Figures of a results folder (matplotlib, Agg only: no display, no pyplot global state).

Every function writes one PNG (or one per dataset setting) under ``out_dir`` and returns its path;
it raises :class:`NothingToPlot` with a reason when the folder holds no data for it, so a report on
a partial sweep can say what is missing instead of crashing. Failed runs are not plotted (the
report lists them); completed and still-running runs are.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.load import Results, with_keys  # noqa: E402
from analysis.paper import method_label  # noqa: E402

DPI = 110


class NothingToPlot(ValueError):
    """The results hold no data for this figure (the message says why)."""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_").lower()


def _plotted_runs(results: Results) -> pd.DataFrame:
    runs = results.runs[results.runs["status"] != "failed"]
    return with_keys(runs)


def _series_label(method: str, privacy: str, n: int) -> str:
    return f"{method_label(method)} [{privacy}] (n={n} run{'s' if n != 1 else ''})"


def _colours(results: Results) -> dict[str, tuple]:
    """One colour per method of the whole folder, so a method looks the same in every figure."""
    cmap = matplotlib.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(sorted(set(results.runs["method"].dropna())))}


def _save(fig: Figure, out_dir: str | Path, name: str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _rounds_with_keys(results: Results, column: str) -> pd.DataFrame:
    runs = _plotted_runs(results)
    keys = runs[["run_id", "method", "privacy", "setting", "delta", "clipping"]]
    merged = results.rounds.merge(keys, on="run_id", how="inner")
    return merged[merged[column].notna()]


def _band(ax, data: pd.DataFrame, column: str, colour, label_prefix: str = "") -> None:
    """Mean over seeds per round as a line, ±1 std (seeds with that round) as a band."""
    for (method, privacy), g in data.groupby(["method", "privacy"], sort=True):
        stats = g.groupby("round")[column].agg(["mean", "std", "count"]).reset_index()
        n = g["run_id"].nunique()
        ax.plot(stats["round"], stats["mean"], marker="o", ms=3, color=colour[method],
                label=label_prefix + _series_label(method, privacy, n))
        std = stats["std"].fillna(0.0)
        ax.fill_between(stats["round"], stats["mean"] - std, stats["mean"] + std, color=colour[method], alpha=0.2, lw=0)


def plot_metrics_per_round(results: Results, out_dir: str | Path) -> list[Path]:
    """Test accuracy and macro-F1 per round, one line per method (mean over seeds, band ±1 std),
    one figure per dataset setting (dataset, partition, α)."""
    data = _rounds_with_keys(results, "test_accuracy")
    if data.empty:
        raise NothingToPlot("no rounds recorded yet")
    colour = _colours(results)
    paths = []
    for setting, g in data.groupby("setting", sort=True):
        fig = Figure(figsize=(12, 4.6))
        axes = fig.subplots(1, 2)
        for ax, column, ylabel in ((axes[0], "test_accuracy", "test accuracy (fraction)"),
                                   (axes[1], "test_f1", "test macro-F1 (fraction)")):
            _band(ax, g, column, colour)
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            ax.set_title(ylabel.split(" (")[0])
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(labels)),
                   title="method [privacy] (runs); band = ±1 std over seeds", fontsize=8)
        fig.suptitle(f"Global model on the test split per round — {setting}")
        paths.append(_save(fig, out_dir, f"metrics_{_slug(setting)}"))
    return paths


def plot_clip_norm(results: Results, out_dir: str | Path) -> Path:
    """C^(t), the clip norm used in round t (mean over seeds), per DP method; one panel per setting."""
    data = _rounds_with_keys(results, "clip_norm")
    data = data[data["clipping"].fillna("") != "none"]   # C means nothing without DP
    if data.empty:
        raise NothingToPlot("no DP run has recorded a clip norm yet")
    colour = _colours(results)
    settings = sorted(data["setting"].unique())
    fig = Figure(figsize=(6.5 * len(settings), 4.6))
    axes = np.atleast_1d(fig.subplots(1, len(settings)))
    for ax, setting in zip(axes, settings):
        g = data[data["setting"] == setting]
        _band(ax, g, "clip_norm", colour)
        values = g["clip_norm"][g["clip_norm"] > 0]
        if len(values) and values.max() / values.min() > 10:
            ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel("clip norm C (gradient l2 norm)")
        ax.set_title(setting)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8, title="method [privacy] (runs)")
    fig.suptitle("Clipping threshold C$^{(t)}$ per round (fixed for non-adaptive methods)")
    return _save(fig, out_dir, "clip_norm")


def plot_robust_weights(results: Results, out_dir: str | Path, run_id: str | None = None) -> Path:
    """Heatmap of CRA's robust weights p̃_i per client × round for one run (default: the completed
    feddimdp run with the lowest seed, else any run that logged robust weights)."""
    clients = results.clients[results.clients["robust_weight"].notna()]
    if run_id is None:
        runs = results.runs[results.runs["run_id"].isin(clients["run_id"].unique())]
        if runs.empty:
            raise NothingToPlot("no run logged CRA robust weights (no feddimdp run with CRA in this folder)")
        runs = runs.assign(_pref=[(m != "feddimdp", s != "completed", sd) for m, s, sd in
                                  zip(runs["method"], runs["status"], runs["seed"])]).sort_values("_pref")
        run_id = runs["run_id"].iloc[0]
    g = clients[clients["run_id"] == run_id]
    if g.empty:
        raise NothingToPlot(f"run {run_id} logged no CRA robust weights")
    run = results.runs[results.runs["run_id"] == run_id].iloc[0]
    grid = g.pivot_table(index="client_id", columns="round", values="robust_weight", aggfunc="first")
    fig = Figure(figsize=(max(6.0, 0.45 * grid.shape[1] + 3), max(3.5, 0.4 * grid.shape[0] + 1.5)))
    ax = fig.subplots()
    im = ax.imshow(grid.to_numpy(), aspect="auto", cmap="viridis", vmin=0,
                   extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5, grid.index.max() + 0.5, grid.index.min() - 0.5))
    if grid.size <= 300:
        for (ci, r), v in np.ndenumerate(grid.to_numpy()):
            if not math.isnan(v):
                ax.text(grid.columns[r], grid.index[ci], f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if v < 0.6 * np.nanmax(grid.to_numpy()) else "black")
    ax.set_xticks(list(grid.columns))
    ax.set_yticks(list(grid.index))
    ax.set_xlabel("round")
    ax.set_ylabel("client id")
    fig.colorbar(im, ax=ax, label=r"robust weight $\tilde{p}_i$ (share of the aggregate)")
    ax.set_title(f"CRA robust aggregation weights — {method_label(run['method'])}, seed {int(run['seed'])}\n{run_id}",
                 fontsize=10)
    return _save(fig, out_dir, f"robust_weights_{_slug(run_id)}")


def plot_epsilon_vs_accuracy(results: Results, out_dir: str | Path) -> Path:
    """Test accuracy against ε spent so far (rounds.epsilon, whose ε each series' privacy label says:
    ``epsilon_scope``), mean over seeds; non-private runs (ε = ∞) are drawn as a dashed line at their final
    mean accuracy."""
    data = _rounds_with_keys(results, "test_accuracy")
    if data.empty:
        raise NothingToPlot("no rounds recorded yet")
    finite = data[np.isfinite(data["epsilon"].astype(float))]
    infinite = data[~np.isfinite(data["epsilon"].astype(float))]
    deltas = sorted(set(finite["delta"].dropna()))
    delta_txt = f"δ={deltas[0]:g}" if len(deltas) == 1 else ("δ per run: " + ", ".join(f"{d:g}" for d in deltas) if deltas else "δ")
    colour = _colours(results)
    settings = sorted(data["setting"].unique())
    fig = Figure(figsize=(6.5 * len(settings), 4.6))
    axes = np.atleast_1d(fig.subplots(1, len(settings)))
    for ax, setting in zip(axes, settings):
        ys: list[float] = []
        for (method, privacy), g in finite[finite["setting"] == setting].groupby(["method", "privacy"], sort=True):
            stats = g.groupby("round")[["epsilon", "test_accuracy"]].mean()
            ax.plot(stats["epsilon"], stats["test_accuracy"], marker="o", ms=3, color=colour[method],
                    label=_series_label(method, privacy, g["run_id"].nunique()))
            ys += list(stats["test_accuracy"])
        for (method, privacy), g in infinite[infinite["setting"] == setting].groupby(["method", "privacy"], sort=True):
            last = g.sort_values("round").groupby("run_id")["test_accuracy"].last().mean()
            ax.axhline(last, ls="--", color=colour[method],
                       label=_series_label(method, privacy, g["run_id"].nunique()) + ", ε=∞, final")
            ys.append(last)
        if ys:   # axhline does not take part in autoscaling: keep the no-DP lines off the frame
            lo, hi = min(ys), max(ys)
            pad = 0.08 * (hi - lo) if hi > lo else 0.05
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel(f"ε spent so far ({delta_txt}; per-client: max over clients, else the population's or "
                      f"deployment's, as each label says)")
        ax.set_ylabel("test accuracy (fraction)")
        ax.set_title(setting)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, title="method [privacy] (runs)")
    fig.suptitle("Privacy spent vs test accuracy (one point per round)")
    return _save(fig, out_dir, "epsilon_vs_accuracy")


def plot_partition(results: Results, out_dir: str | Path, run_id: str | None = None) -> Path:
    """Stacked bars of training examples per class for each client of one run (default: the first
    completed run by run_id, else any run with a partition)."""
    parts = results.partitions[results.partitions["split"] == "train"]
    if parts.empty:
        raise NothingToPlot("no run has written its partition yet")
    if run_id is None:
        runs = results.runs[results.runs["run_id"].isin(parts["run_id"].unique())]
        runs = runs.assign(_pref=runs["status"] != "completed").sort_values(["_pref", "run_id"])
        run_id = runs["run_id"].iloc[0] if len(runs) else parts["run_id"].iloc[0]
    g = parts[parts["run_id"] == run_id]
    if g.empty:
        raise NothingToPlot(f"run {run_id} has no training partition")
    counts = g.pivot_table(index="client_id", columns="label", values="count", aggfunc="sum", fill_value=0)
    run = with_keys(results.runs[results.runs["run_id"] == run_id]).iloc[0]
    fig = Figure(figsize=(max(6.0, 0.6 * len(counts) + 3), 4.6))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["tab10" if counts.shape[1] <= 10 else "tab20"]
    bottom = np.zeros(len(counts))
    for j, label in enumerate(counts.columns):
        ax.bar(counts.index, counts[label], bottom=bottom, color=cmap(j % cmap.N), label=str(label))
        bottom += counts[label].to_numpy()
    ax.set_xticks(list(counts.index))
    ax.set_xlabel("client id")
    ax.set_ylabel("training examples (count)")
    ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    ax.set_title(f"Training data per client and class — {run['setting']}, seed {int(run['seed'])}\n{run_id}", fontsize=10)
    return _save(fig, out_dir, f"partition_{_slug(run_id)}")


EXAMPLE_NORM_PANELS = 6   # runs per figure of plot_clip_vs_example_norms (a 2 × 3 grid at most)


def plot_clip_vs_example_norms(results: Results, out_dir: str | Path) -> list[Path]:
    """C^(t) against the clients' median per-example gradient norms, one panel per run that logged
    the (never uploaded) true medians ``clients.example_norm_median_true``; at most
    ``EXAMPLE_NORM_PANELS`` panels per PNG.

    Per round: C^(t) (rounds.clip_norm) as a line, the spread over clients of the true medians as
    a band (min to max) with their median over clients as a line, and the median over clients of
    the private, noised medians (clients.example_norm_median, what ADPC reads) as a dashed line.
    Log y-axis; non-positive values (a noised median can be ≤ 0) cannot be drawn on it and are
    left out, and the legend counts them.
    """
    clients = results.clients
    if "example_norm_median_true" not in clients.columns:
        raise NothingToPlot("no run logged the clients' true median per-example gradient norm "
                            "(this folder has no column example_norm_median_true)")
    runs = _plotted_runs(results)
    logged = clients[clients["example_norm_median_true"].notna() & clients["run_id"].isin(runs["run_id"])]
    if logged.empty:
        raise NothingToPlot("no run logged the clients' true median per-example gradient norm "
                            "(example_norm_median_true is null for every non-failed run)")
    runs = runs[runs["run_id"].isin(logged["run_id"].unique())].sort_values(["method", "setting", "seed", "run_id"])
    has_private = "example_norm_median" in clients.columns
    rounds = results.rounds

    paths = []
    n_figures = math.ceil(len(runs) / EXAMPLE_NORM_PANELS)
    for k in range(n_figures):
        chunk = runs.iloc[k * EXAMPLE_NORM_PANELS:(k + 1) * EXAMPLE_NORM_PANELS]
        ncols = min(3, len(chunk))
        nrows = math.ceil(len(chunk) / ncols)
        fig = Figure(figsize=(6.2 * ncols, 4.6 * nrows))
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        for ax, (_, run) in zip(axes, chunk.iterrows()):
            _example_norm_panel(ax, run, logged[logged["run_id"] == run["run_id"]],
                                clients[clients["run_id"] == run["run_id"]] if has_private else None,
                                rounds[rounds["run_id"] == run["run_id"]])
        for ax in axes[len(chunk):]:
            ax.set_visible(False)
        part = f" ({k + 1}/{n_figures})" if n_figures > 1 else ""
        fig.suptitle("Clip norm C$^{(t)}$ vs the clients' median per-example gradient norms" + part)
        fig.tight_layout()
        suffix = f"_{k + 1}" if n_figures > 1 else ""
        paths.append(_save(fig, out_dir, f"clip_vs_example_norms{suffix}"))
    return paths


def _positive(values: pd.Series) -> tuple[pd.Series, int]:
    """The strictly positive, finite values (drawable on a log axis) and how many others were dropped."""
    values = values.dropna().astype(float)
    keep = np.isfinite(values) & (values > 0)
    return values[keep], int((~keep).sum())


def _example_norm_panel(ax, run: pd.Series, true: pd.DataFrame, private: pd.DataFrame | None,
                        rounds: pd.DataFrame) -> None:
    true_med, dropped_true = _positive(true.set_index("round")["example_norm_median_true"])
    spread = true_med.groupby(level=0).agg(["min", "median", "max"]).sort_index()
    ax.fill_between(spread.index, spread["min"], spread["max"], color="tab:blue", alpha=0.22, lw=0,
                    label="true medians, min–max over clients")
    ax.plot(spread.index, spread["median"], color="tab:blue", marker="o", ms=3,
            label="true medians, median over clients" + (f" ({dropped_true} ≤ 0 not shown)" if dropped_true else ""))
    if private is not None:
        noised = private.groupby("round")["example_norm_median"].median().sort_index()
        noised, dropped = _positive(noised)
        if len(noised):
            ax.plot(noised.index, noised.to_numpy(), color="tab:orange", ls="--", marker="x", ms=4,
                    label="private (noised) medians, median over clients"
                    + (f" ({dropped} round(s) ≤ 0 not shown)" if dropped else ""))
    clip, dropped_clip = _positive(rounds.set_index("round")["clip_norm"].sort_index())
    if len(clip):
        ax.plot(clip.index, clip.to_numpy(), color="black", lw=1.8, marker="s", ms=3,
                label="clip norm C$^{(t)}$" + (f" ({dropped_clip} ≤ 0 not shown)" if dropped_clip else ""))
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("gradient norm (l2)")
    seed = f", seed {int(run['seed'])}" if not pd.isna(run["seed"]) else ""
    ax.set_title(f"{method_label(run['method'])} [{run['privacy']}]{seed}\n{run['run_id']}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)


def plot_tuning(tuning: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """One figure per tune: each contestant's validation objective against lr (search stage: the mean
    over tuning seeds, the best over the other searched keys at each lr; private mode: every draw), with
    the chosen candidate circled. Failed and diverged candidates are drawn as crosses at the bottom."""
    if tuning.empty:
        raise NothingToPlot("no tuning table (run `raysim tune`)")
    paths = []
    for tune_id, t in tuning.groupby("tune_id", sort=True):
        search = t[t["stage"].isin(["search", "private"])]
        if search.empty:
            continue
        labels = list(dict.fromkeys(search["contestant"]))
        cmap = matplotlib.colormaps["tab10"]
        fig = Figure(figsize=(7, 4.6))
        ax = fig.subplots()
        bottom = np.nanmin(search["objective"].astype(float)) if search["objective"].notna().any() else 0.0
        for i, label in enumerate(labels):
            g = search[search["contestant"] == label]
            colour = cmap(i % 10)
            if (g["stage"] == "private").any():
                ok = g[g["objective"].notna()]
                ax.scatter(ok["lr"], ok["objective"], color=colour, s=18, label=f"{label} (draws)")
                best = ok[ok["chosen"]]
            else:
                per = g.groupby(["candidate", "lr"], as_index=False).agg(objective=("candidate_objective", "first"),
                                                                         chosen=("chosen", "any"))
                ok = per[per["objective"].notna()]
                line = ok.groupby("lr")["objective"].max().sort_index()
                ax.plot(line.index, line.values, marker="o", ms=4, color=colour, label=label)
                best = ok[ok["chosen"]]
                failed = per[per["objective"].isna()]
                if len(failed):
                    ax.scatter(failed["lr"], [bottom] * len(failed), marker="x", color=colour)
            if len(best):
                ax.scatter(best["lr"], best["objective"], s=140, facecolors="none", edgecolors=colour, linewidths=2)
        ax.set_xscale("log")
        name = t["objective_name"].iloc[0]
        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel(f"validation {name} (server hold-out)")
        ax.set_title(f"{t['tune_name'].iloc[0]}: objective vs lr (circled: chosen; x: failed or diverged)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, out_dir, f"tuning_{_slug(str(tune_id))}"))
    if not paths:
        raise NothingToPlot("no search-stage rows in the tuning table")
    return paths
