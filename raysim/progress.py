"""Terminal output of ``raysim run``: a progress bar per run."""

from __future__ import annotations

import math
import sys
from typing import Any

from tqdm import tqdm

from raysim.results.rows import epsilon_label
from raysim.run_plan import RunPlan
from raysim.simulation import RoundRecord, SetupRecord


class RunProgress:
    """``method dataset: round k/T | acc 0.812 | ε 3.21 (per-client)`` on stderr (whose ε: ``epsilon_scope``)."""

    def __init__(self, plan: RunPlan) -> None:
        cfg = self.cfg = plan.cfg
        self.bar = tqdm(total=cfg.rounds, desc=f"{cfg.method} {cfg.data.name} seed={cfg.seed}", unit="round",
                        file=sys.stderr, dynamic_ncols=True, leave=True)
        self.bar.set_postfix_str("starting actors…")
        self.last_eval: tuple[int, float, float] | None = None
        #: the uploads ε does not cover (privacy.allow_uncovered), and whose ε it is, shown beside ε
        self.exceptions, self.scope = plan.epsilon_exceptions, plan.epsilon_scope

    def setup(self, setup: SetupRecord) -> None:
        sig = setup.max_noise_multiplier
        if setup.clipping == "none":
            text = "no DP"
        elif math.isnan(sig):
            text = f"clipping={setup.clipping} σ planned per client as it first trains"
        else:
            text = f"clipping={setup.clipping} σ≤{sig:.3f}"
        if setup.resumed_after:
            self.bar.update(setup.resumed_after)
            text = f"resumed after round {setup.resumed_after}; {text}"
        self.bar.set_postfix_str(text)

    def round(self, rec: RoundRecord) -> None:
        r = rec.round_row
        eps = epsilon_label(r["epsilon"], self.exceptions, self.scope)
        if math.isfinite(r["test_accuracy"]):   # with eval_every > 1, the last evaluated round's metrics
            self.last_eval = (rec.server_round, r["test_accuracy"], r["test_f1"])
        if self.last_eval is None:
            self.bar.set_postfix_str(f"not evaluated yet ε {eps}")
        else:
            k, acc, f1 = self.last_eval
            at = "" if k == rec.server_round else f" (round {k})"
            self.bar.set_postfix_str(f"acc {acc:.3f} f1 {f1:.3f}{at} ε {eps}")
        self.bar.update(1)

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()
