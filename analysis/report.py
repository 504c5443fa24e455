"""``report.md`` + ``report.html`` + ``summary.csv`` for a results folder, complete or not."""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Union

import pandas as pd

from analysis import plots
from analysis.load import Results, load_results, with_keys
from analysis.tables import MISSING, PAPER_SUFFIX, summarise, table1, table2, to_markdown
from raysim.results import read_table
from raysim.results.rows import exceptions_of
from raysim.config import ConfigError

ACCOUNTING_SCOPE = (
    "Each run's ε is for its privacy unit (the column 'unit'). Unit example: record-level (ε, δ)-DP per "
    "client: neighbouring datasets differ in one training example of one client, the server is honest but "
    "curious, and each client is accounted separately; a run's ε is the maximum over its clients. Unit client: "
    "neighbouring federations differ in one whole client ('adjacency'), the server adds the noise once to the "
    "cohort's clipped updates (a trusted aggregator), and one ledger holds the population's ε; where the noise "
    "is sized for a deployment, the ε is that deployment's, not the simulated federation's ('ε is for'). "
    "Every ε shown carries whose it is in brackets (epsilon_scope): per-client, population or deployment. "
    "(docs/privacy.md.) ε covers the releases that the accountant composed. It does not cover values that "
    "clients upload and that are computed from private data outside them; the column 'not covered by ε' "
    "lists them for each run.")


@dataclass
class _Heading:
    text: str
    level: int = 2


@dataclass
class _Text:
    text: str


@dataclass
class _Table:
    frame: pd.DataFrame
    index: bool = False


@dataclass
class _Image:
    path: str   # relative to the report folder
    caption: str


_Block = Union[_Heading, _Text, _Table, _Image]


def _fmt_float(v: object, spec: str = "{:.4g}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return spec.format(v) if isinstance(v, float) else str(v)


def _not_covered_text(row: pd.Series) -> str:
    text = row["not_covered_by_epsilon"]
    if not isinstance(text, str):
        return "unknown (the run has not finished its setup)"
    return text or "nothing uploaded outside DP-SGD"


def _epsilon_text(row: pd.Series) -> str:
    """ε with whose it is (``epsilon_scope``) and the uploads it does not cover (``privacy.allow_uncovered``)."""
    text = _fmt_float(row["epsilon"])
    scope = row.get("epsilon_scope")
    if isinstance(scope, str) and scope and text not in (MISSING, "∞"):
        text = f"{text} ({scope})"
    keys = exceptions_of(row.get("epsilon_exceptions"))
    return f"{text} except {', '.join(keys)}" if keys else text


def _attention(runs: pd.DataFrame) -> pd.DataFrame:
    incomplete = runs["rounds_completed"].fillna(0) < runs["rounds"]
    sel = runs[(runs["status"] != "completed") | incomplete]
    return pd.DataFrame({
        "run_id": sel["run_id"], "method": sel["method"], "status": sel["status"],
        "rounds done": [f"{int(d) if not pd.isna(d) else 0}/{int(r)}" for d, r in zip(sel["rounds_completed"], sel["rounds"])],
        "error": [e if isinstance(e, str) else MISSING for e in sel["error"]],
    })


def _column(runs: pd.DataFrame, name: str) -> list[str]:
    values = runs[name] if name in runs else pd.Series([None] * len(runs), index=runs.index)
    return [v if isinstance(v, str) else MISSING for v in values]


def _privacy_table(runs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": runs["run_id"], "method": runs["method"], "status": runs["status"],
        "ε spent": [_epsilon_text(r) for _, r in runs.iterrows()], "δ": [_fmt_float(d, "{:g}") for d in runs["delta"]],
        "σ (max over clients)": [_fmt_float(s) for s in runs["noise_multiplier"]],
        "clipping": [c if isinstance(c, str) else MISSING for c in runs["clipping"]],
        "accountant": runs["accountant"].fillna(MISSING),
        "unit": _column(runs, "privacy_unit"), "adjacency": _column(runs, "adjacency"),
        "ε is for": _column(runs, "epsilon_scope_detail" if "epsilon_scope_detail" in runs else "epsilon_scope"),
        "not covered by ε": [_not_covered_text(r) for _, r in runs.iterrows()],
    })


def _summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary.copy()
    for c in ("accuracy_mean", "accuracy_std", "f1_mean", "f1_std"):
        out[c] = [_fmt_float(v, "{:.4f}") for v in out[c]]
    out["epsilon_mean"] = [_fmt_float(v) for v in out["epsilon_mean"]]
    out["delta"] = [_fmt_float(v, "{:g}") for v in out["delta"]]
    out["alpha"] = [_fmt_float(v, "{:g}") for v in out["alpha"]]
    return out


def _comparison(rows: list[dict], reference: str | None) -> pd.DataFrame:
    def ci(lo: float, hi: float, signed: bool = False) -> str:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return MISSING
        return f"[{lo:+.4f}, {hi:+.4f}]" if signed else f"[{lo:.4f}, {hi:.4f}]"
    out = pd.DataFrame({
        "contestant": [r["contestant"] for r in rows], "hyperparameters": [r["chosen"] or MISSING for r in rows],
        "seeds": [r["seeds"] for r in rows],
        "mean ± std": [MISSING if math.isnan(r["mean"]) else f"{r['mean']:.4f} ± {_fmt_float(r['std'], '{:.4f}')}"
                       for r in rows],
        "95% CI": [ci(r["ci_low"], r["ci_high"]) for r in rows],
    })
    if reference:
        out[f"paired Δ vs {reference} (95% CI)"] = [
            "reference" if "diff" not in r else
            (MISSING if math.isnan(r["diff"]) else f"{r['diff']:+.4f} {ci(r['diff_low'], r['diff_high'], True)}")
            for r in rows]
    return out


def _tuning_blocks(tuning: pd.DataFrame) -> list[_Block]:
    """Per tune: the tuned table beside the fixed one, the chosen values, and the tuning's privacy cost."""
    from raysim.tune import edge_choices, summarise as summarise_tune
    blocks: list[_Block] = [_Heading("Tuned comparisons (`raysim tune`)")]
    for tune_id, t in tuning.groupby("tune_id", sort=True):
        records = t.to_dict("records")
        name, objective = t["tune_name"].iloc[0], t["objective_name"].iloc[0]
        metric = "test_accuracy" if objective == "accuracy" else "test_f1"
        private = bool(t["private"].iloc[0])
        reference = next((r for r in t["reference"] if isinstance(r, str)), None)
        final = t[t["stage"] == ("private" if private else "final")]
        seeds = sorted(set(final["seed"]))
        blocks += [_Heading(f"{name} (`{tune_id}`)", 3),
                   _Text(f"Tuned: each contestant at its best candidate by validation {objective} on the public server "
                         f"hold-out (never the test split), then the test {objective} over the final seeds {seeds}: "
                         "mean ± sample std, Student-t 95% confidence interval, and the paired difference to the "
                         "reference on the same seeds and partitions."),
                   _Table(_comparison(summarise_tune(records, "private" if private else "final", metric), reference)),
                   _Text("Fixed: the base config's hyperparameters, same seeds."),
                   _Table(_comparison(summarise_tune(records, "fixed", metric), reference))]
        search = t[t["stage"] == "search"]
        if "epsilon_exceptions" in t:
            uncovered = sorted({f"{c}: {e}" for c, e in zip(t["contestant"], t["epsilon_exceptions"]) if isinstance(e, str) and e})
            if uncovered:   # ε is never shown bare for a contestant that opted in to uncovered uploads
                blocks.append(_Text("ε does not cover these uploads, which the config opted in to "
                                    "(privacy.allow_uncovered): " + "; ".join(uncovered) + "."))
        if len(search):
            chosen = (search[search["chosen"]].groupby("contestant", sort=False)
                      .agg(candidate=("candidate", "first"), objective=("candidate_objective", "first")).reset_index())
            n_cand = search.groupby("contestant")["candidate"].nunique()
            chosen["candidates searched"] = [int(n_cand[c]) for c in chosen["contestant"]]
            chosen["objective"] = [_fmt_float(v, "{:.4f}") for v in chosen["objective"]]
            blocks += [_Text("Chosen values (mean validation objective over the tuning seeds):"), _Table(chosen)]
            edges = edge_choices(records)
            if edges:
                blocks.append(_Text("At the edge of the search space: " + "; ".join(edges) + "."))
            blocks.append(_Text(
                f"Privacy: the ε of each run covers that run only; the tuning's privacy cost is not included (the "
                f"field's common practice). {search[['contestant', 'candidate']].drop_duplicates().shape[0]} candidate "
                f"configurations were trained on the clients' data on {search['seed'].nunique()} tuning seed(s): "
                f"{len(search)} training runs before the final seeds."))
        else:
            eps = final.groupby("contestant", sort=False)["released_epsilon"].max()
            draws = final.groupby("contestant", sort=False).size()
            scopes = ({c: f" ({v})" for c, v in zip(final["contestant"], final["epsilon_scope"]) if isinstance(v, str) and v}
                      if "epsilon_scope" in final else {})
            blocks.append(_Text(
                "Privacy (private tuning, Papernot & Steinke 2022): on each final seed a random number of candidates "
                "was trained and only the best by validation released; ε of the released model, tuning included "
                "(largest over the seeds, at the runs' δ): "
                + "; ".join(f"{c}: ε ≤ {_fmt_float(e, '{:.3f}')}{scopes.get(c, '')} ({draws[c]} draws)"
                            for c, e in eps.items()) + "."))
    return blocks


def _blocks(folder: str, results: Results, figures_dir: Path, out: Path) -> tuple[list[_Block], pd.DataFrame]:
    runs = with_keys(results.runs).sort_values(["method", "dataset", "seed", "run_id"])
    counts = runs["status"].value_counts()
    blocks: list[_Block] = [
        _Heading("raysim results report", 1),
        _Text(f"Results folder: `{folder}` — generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}. "
              f"{len(runs)} run(s): " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "."),
    ]

    blocks.append(_Heading("Runs that are running, failed or missing rounds"))
    attention = _attention(runs)
    if attention.empty:
        blocks.append(_Text(f"None: all {len(runs)} runs completed all their rounds."))
    else:
        blocks += [_Text("These runs are left out of the summary and the tables (which use completed runs only); "
                         "running runs are plotted with the rounds they have so far, failed runs are not plotted."),
                   _Table(attention)]

    blocks += [_Heading("Privacy: ε, δ and what the accountant does not cover"), _Text(ACCOUNTING_SCOPE),
               _Text("For a run that is not completed, ε is what it has spent so far."), _Table(_privacy_table(runs))]

    summary = summarise(results.runs)
    blocks.append(_Heading("Summary over seeds (completed runs)"))
    if summary.empty:
        blocks.append(_Text("No completed run yet."))
    else:
        blocks += [_Text("Final-round test accuracy and macro-F1: mean and sample standard deviation over seeds "
                         f"({MISSING} for a single seed). `privacy` is the run's setting (no DP, target ε or given σ). "
                         "Also written to `summary.csv`.")]
        mixed = summary[summary["n_configs"] > 1]
        if len(mixed):
            blocks.append(_Text(f"Warning: {len(mixed)} row(s) average runs whose configs differ in more than the "
                                "seed (see `n_configs`)."))
        blocks.append(_Table(_summary_display(summary)))

    tuning = read_table(folder, "tuning")
    if not tuning.empty:
        blocks += _tuning_blocks(tuning)

    note = (f"Our cells: accuracy / macro-F1 of the final round, mean ± std over completed seeds (n = number of seeds); "
            f"{MISSING} = no completed run. Columns marked '{PAPER_SUFFIX}' are the numbers the FedDimDP paper "
            "reports, copied for comparison: they are the paper's claims, not results of this project, "
            "and may come from settings (rounds, α, model) other than these runs.")
    blocks += [_Heading("Table I — methods vs the paper"), _Text(note), _Table(table1(results.runs), index=True),
               _Heading("Table II — FedDimDP ablations vs the paper"), _Table(table2(results.runs), index=True)]

    blocks.append(_Heading("Figures"))
    notes: list[str] = []

    def figure(make: Callable[[], object], caption: str) -> None:
        try:
            made = make()
        except plots.NothingToPlot as exc:
            notes.append(f"{caption.split(':')[0]}: skipped — {exc}.")
            return
        for path in made if isinstance(made, list) else [made]:
            blocks.append(_Image(os.path.relpath(path, out), caption))

    figure(lambda: plots.plot_metrics_per_round(results, figures_dir),
           "Test accuracy and macro-F1 per round: mean over seeds, band ±1 std")
    figure(lambda: plots.plot_clip_norm(results, figures_dir), "Clip norm C^(t) per round (DP runs)")
    figure(lambda: plots.plot_clip_vs_example_norms(results, figures_dir),
           "Clip norm vs per-example gradient norms (one panel per run): C^(t) against the spread of the "
           "clients' true (never uploaded) median per-example gradient norms; ADPC sets C^(t+1) from the "
           "noised medians.")
    figure(lambda: plots.plot_robust_weights(results, figures_dir), "CRA robust weights per client and round")
    figure(lambda: plots.plot_epsilon_vs_accuracy(results, figures_dir), "ε spent vs test accuracy")
    figure(lambda: plots.plot_partition(results, figures_dir), "Training examples per client and class (one run)")
    if not tuning.empty:
        figure(lambda: plots.plot_tuning(tuning, figures_dir),
               "Validation objective against the learning rate, per contestant (`raysim tune`)")
    if notes:
        blocks += [_Heading("Figures not drawn", 3), _Text("\n".join(f"- {n}" for n in notes))]
    return blocks, summary


def _markdown(blocks: list[_Block]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, _Heading):
            parts.append("#" * b.level + " " + b.text)
        elif isinstance(b, _Text):
            parts.append(b.text)
        elif isinstance(b, _Table):
            parts.append(to_markdown(b.frame, index=b.index))
        else:
            parts.append(f"![{b.caption}]({b.path})\n\n*{b.caption}*")
    return "\n\n".join(parts) + "\n"


def _inline_md(text: str) -> str:
    # the only markup used in _Text: `code`
    escaped = html.escape(text)
    pieces = escaped.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def _html(blocks: list[_Block]) -> str:
    body = []
    for b in blocks:
        if isinstance(b, _Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, _Text):
            lines = b.text.split("\n")
            if all(line.startswith("- ") for line in lines):
                body.append("<ul>" + "".join(f"<li>{_inline_md(line[2:])}</li>" for line in lines) + "</ul>")
            else:
                body.append(f"<p>{_inline_md(b.text)}</p>")
        elif isinstance(b, _Table):
            body.append(b.frame.to_html(index=b.index, na_rep=MISSING, border=0, classes="results", escape=True))
        else:
            body.append(f'<figure><img src="{html.escape(b.path)}" alt="{html.escape(b.caption)}">'
                        f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
             "table.results{border-collapse:collapse;font-size:0.85em;margin:1em 0}"
             "table.results th,table.results td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}"
             "table.results th{background:#f3f3f3}img{max-width:100%}figcaption{font-style:italic;color:#555}"
             "code{background:#f3f3f3;padding:0 3px}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>raysim results report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def build_report(results_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write report.md, report.html, summary.csv and figures/ under ``out`` (default
    RESULTS_DIR/report) and return that folder. Raises ValueError when the folder has no runs."""
    folder = str(results_dir)
    results = load_results(folder)
    if results.runs.empty:
        raise ConfigError(f"no runs in {folder!r} (expected Parquet files under {os.path.join(folder, 'runs')})")
    out_dir = Path(out) if out is not None else Path(folder) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks, summary = _blocks(folder, results, out_dir / "figures", out_dir)
    summary.to_csv(out_dir / "summary.csv", index=False)
    (out_dir / "report.md").write_text(_markdown(blocks), encoding="utf-8")
    (out_dir / "report.html").write_text(_html(blocks), encoding="utf-8")
    return out_dir
