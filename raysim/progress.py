"""Terminal output: a progress bar per run and a final summary table."""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

from tqdm import tqdm

from raysim.config import Config
from raysim.simulation import RoundRecord, SetupRecord


class RunProgress:
    """``method dataset: round k/T | acc 0.812 | ε 3.21`` on stderr."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.bar = tqdm(total=cfg.rounds, desc=f"{cfg.method} {cfg.data.name} seed={cfg.seed}", unit="round",
                        file=sys.stderr, dynamic_ncols=True, leave=True)
        self.bar.set_postfix_str("starting actors…")

    def setup(self, setup: SetupRecord) -> None:
        sig = max(setup.noise_multipliers)
        self.bar.set_postfix_str(f"clipping={setup.clipping} σ≤{sig:.3f}" if setup.clipping != "none" else "no DP")

    def round(self, rec: RoundRecord) -> None:
        r = rec.round_row
        eps = "∞" if not math.isfinite(r["epsilon"]) else f"{r['epsilon']:.2f}"
        self.bar.set_postfix_str(f"acc {r['test_accuracy']:.3f} f1 {r['test_f1']:.3f} ε {eps}")
        self.bar.update(1)

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "∞" if math.isinf(v) else f"{v:.4f}"
    return "" if v is None else str(v)


def print_summary(rows: Sequence[dict[str, Any]], results_dir: str) -> None:
    cols = [("run_id", "run_id"), ("method", "method"), ("dataset", "dataset"), ("final_test_accuracy", "accuracy"),
            ("final_test_f1", "macro-F1"), ("epsilon", "ε"), ("wall_seconds", "wall s")]
    table = [[_fmt(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, (_, h) in enumerate(cols)]
    print("  ".join(h.ljust(w) for (_, h), w in zip(cols, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    print(f"\nResults (Parquet): {results_dir}/runs, {results_dir}/rounds, {results_dir}/clients, {results_dir}/partitions")
    print(f"  pandas: pd.read_parquet('{results_dir}/rounds')")
