"""Summary tables: mean ± std over seeds, and the paper's Table I / II with its claims alongside."""

from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np
import pandas as pd

from analysis.load import GROUP_KEYS, partition_label, with_keys
from analysis.paper import (PAPER_DATASETS, PAPER_TABLE1, PAPER_TABLE2, TABLE1_METHODS, TABLE2_METHODS,
                            dataset_label, method_label)

MISSING = "—"
PAPER_SUFFIX = "paper (claimed)"
OURS_SUFFIX = "ours"


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std (ddof=1) over seeds of the final test accuracy / macro-F1 of completed runs.

    One row per (method, dataset, partition, alpha, privacy); ``privacy`` is 'no DP', 'ε=…' or
    'σ=…' from the run's config, so private and non-private runs of one method are not averaged
    together. ``n_seeds`` counts the completed runs; std is NaN for a single seed.
    """
    cols = GROUP_KEYS + ["n_seeds", "seeds", "n_configs", "accuracy_mean", "accuracy_std", "f1_mean", "f1_std",
                         "epsilon_mean", "delta", "rounds"]
    done = runs[runs["status"] == "completed"]
    if done.empty:
        return pd.DataFrame(columns=cols)
    done = with_keys(done)
    done["config_key"] = [config_key(c) for c in done["config"]]
    grouped = done.groupby(GROUP_KEYS, dropna=False, sort=True)
    out = grouped.agg(
        n_seeds=("seed", "size"),
        seeds=("seed", lambda s: ",".join(str(int(v)) for v in sorted(s))),
        n_configs=("config_key", "nunique"),
        accuracy_mean=("final_test_accuracy", "mean"), accuracy_std=("final_test_accuracy", "std"),
        f1_mean=("final_test_f1", "mean"), f1_std=("final_test_f1", "std"),
        epsilon_mean=("epsilon", "mean"), delta=("delta", "max"), rounds=("rounds_completed", "max"),
    ).reset_index()
    return out[cols]


def config_key(config_json: str) -> str:
    """The config without seed, runtime and data paths: seeds of one setting share it, so
    ``n_configs`` > 1 in a summary row means differently configured runs were averaged together."""
    try:
        cfg = json.loads(config_json)
    except (TypeError, json.JSONDecodeError):
        return ""
    cfg.pop("seed", None)
    cfg.pop("runtime", None)
    for k in ("root", "cache_dir", "download"):
        cfg.get("data", {}).pop(k, None)
    return json.dumps(cfg, sort_keys=True)


def _pm(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return MISSING
    return f"{mean:.3f}" if std is None or math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def _ours_cell(row: pd.Series | None) -> str:
    if row is None:
        return MISSING
    return f"{_pm(row.accuracy_mean, row.accuracy_std)} / {_pm(row.f1_mean, row.f1_std)} (n={int(row.n_seeds)})"


def _paper_cell(paper: Mapping[str, Mapping[str, tuple[float, float]]], method: str, dataset: str) -> str:
    cell = paper.get(method, {}).get(dataset)
    return MISSING if cell is None else f"{cell[0]:.3f} / {cell[1]:.3f}"


def _paper_layout(runs: pd.DataFrame, methods: Mapping[str, str], paper: Mapping[str, Mapping[str, tuple[float, float]]],
                  include_others: bool) -> pd.DataFrame:
    summary = summarise(runs)
    present = list(dict.fromkeys(summary["method"])) if len(summary) else []
    order = list(methods) + (sorted(m for m in present if m not in methods) if include_others else [])
    # a method run under several privacy settings gets one row per setting
    rows: list[tuple[str, str, str | None]] = []   # (label, method, privacy)
    for m in order:
        settings = sorted(set(summary.loc[summary["method"] == m, "privacy"])) if len(summary) else []
        if len(settings) <= 1:
            rows.append((method_label(m), m, settings[0] if settings else None))
        else:
            rows.extend((f"{method_label(m)} [{p}]", m, p) for p in settings)
    # columns: for each dataset (the paper's first), one "ours" column per partition setting, then the paper's
    datasets = list(PAPER_DATASETS) + sorted(set(summary["dataset"]) - set(PAPER_DATASETS)) if len(summary) else list(PAPER_DATASETS)
    columns: dict[str, list[str]] = {}
    for d in datasets:
        parts = summary.loc[summary["dataset"] == d, ["partition", "alpha"]].drop_duplicates() if len(summary) else pd.DataFrame()
        keys = [(p, a) for p, a in parts.itertuples(index=False)] or [(None, None)]
        for p, a in keys:
            name = f"{dataset_label(d)} — {OURS_SUFFIX}" if len(keys) == 1 else \
                f"{dataset_label(d)} {partition_label(p, a)} — {OURS_SUFFIX}"
            cells = []
            for _, m, priv in rows:
                sel = summary[(summary["method"] == m) & (summary["dataset"] == d) & (summary["privacy"] == priv)
                              & (summary["partition"] == p) & _alpha_eq(summary["alpha"], a)] if len(summary) else summary
                cells.append(_ours_cell(sel.iloc[0]) if len(sel) else MISSING)
            columns[name] = cells
        if d in PAPER_DATASETS:
            columns[f"{dataset_label(d)} — {PAPER_SUFFIX}"] = [_paper_cell(paper, m, d) for _, m, _ in rows]
    table = pd.DataFrame(columns, index=pd.Index([r[0] for r in rows], name="method"))
    return table


def _alpha_eq(series: pd.Series, alpha: float | None) -> pd.Series:
    if alpha is None or (isinstance(alpha, float) and np.isnan(alpha)):
        return series.isna()
    return np.isclose(series.astype(float), alpha)


def table1(runs: pd.DataFrame) -> pd.DataFrame:
    """Paper Table I layout: rows DP-FedSAM … FedDimDP (then any other method we ran), one column
    per dataset with our 'accuracy / macro-F1' (mean ± std over completed seeds, n seeds) and,
    next to it, the paper's claimed numbers (analysis/paper.py). Cells with no data are '—'."""
    return _paper_layout(runs, TABLE1_METHODS, PAPER_TABLE1, include_others=True)


def table2(runs: pd.DataFrame) -> pd.DataFrame:
    """Paper Table II (ablation) layout: FedDimDP and its w/o-CRA, w/o-ADPC, w/o-LLDM variants."""
    return _paper_layout(runs, TABLE2_METHODS, PAPER_TABLE2, include_others=False)


def to_markdown(df: pd.DataFrame, index: bool = True, floatfmt: str = "{:.4g}") -> str:
    """A GitHub-flavoured Markdown table (pandas' to_markdown needs the optional tabulate)."""
    frame = df.reset_index() if index else df

    def fmt(v: object) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NaT:
            return MISSING
        if isinstance(v, float):
            return floatfmt.format(v)
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(fmt(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])
