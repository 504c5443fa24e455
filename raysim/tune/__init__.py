"""Tune files: each method at its own best hyperparameters, chosen on validation data, then reported
on fresh seeds with confidence intervals.

A tune file::

    name: quickstart                   # optional; default: the file's stem
    base: ../quickstart.yaml           # a config file (relative to this file) or a config mapping
    set: {rounds: 20, data.server_holdout: 200}   # optional dotted overrides of the base
    methods:                           # contestants: a method name, or {label, method, set}
      - fedsa
      - {label: fedsa+lldm, method: feddimdp, set: {feddimdp.adpc: false, feddimdp.cra: false}}
    space:                             # dotted key -> list of values, or {log: [lo, hi], num: n}
      lr: {log: [0.03, 1.0], num: 5}   # default: 5 log-spaced values spanning 30x around the base lr
      privacy.clip_norm: [0.3, 1, 3]   # searched for fixed-clip methods only (not ADPC, not adaptive quantile)
    method_space:                      # optional, per contestant label: keys added to (or replacing) `space`
      feddimdp: {adpc.quantile: [0.5, 0.75]}
    search: grid                       # grid | random (`budget` candidates per contestant, seeded by search_seed)
    tuning_seeds: [100, 101]           # stage 1: every candidate on each of these
    final_seeds: [0, 1, 2, 3, 4]       # stage 2: the chosen candidate (and the base config); disjoint from the above
    objective: accuracy                # accuracy | f1 of the final global model on the validation set
    reference: fedsa                   # paired differences are taken against this contestant
    private: false                     # true: Papernot–Steinke random-count tuning, only the best released

The validation set is the public server hold-out (``data.server_holdout`` > 0, drawn from the training
split before partitioning and owned by no client); the test split is read only by the final report.
Nothing here imports Ray: :mod:`raysim.cli.tune` runs the stages as ordinary sweeps. The package by concern:
:mod:`~raysim.tune.spec` (the parsed types), :mod:`~raysim.tune.parse` (the file), :mod:`~raysim.tune.plan`
(configs, candidates, stages), :mod:`~raysim.tune.select` (choosing), :mod:`~raysim.tune.stats` (intervals and
their adjustment), :mod:`~raysim.tune.report` (the ``tuning`` table and its summaries).
"""

from raysim.tune.parse import load_tune, parse_tune
from raysim.tune.plan import (PlannedRun, as_sweep, candidates, config_for, final_runs, private_runs, search_runs,
                              space_of)
from raysim.tune.report import edge_choices, summarise, tuning_rows
from raysim.tune.select import candidate_scores, choose, diverged, released
from raysim.tune.spec import (OBJECTIVES, PRIVACY_NEUTRAL_KEYS, TEST_METRICS, Candidate, Contestant, TuneSpec)
from raysim.tune.stats import mean_ci

__all__ = ["Contestant", "Candidate", "TuneSpec", "PlannedRun", "load_tune", "parse_tune", "candidates", "config_for",
           "space_of", "search_runs", "final_runs", "private_runs", "as_sweep", "choose", "candidate_scores",
           "released", "diverged", "tuning_rows", "edge_choices", "summarise", "mean_ci", "OBJECTIVES",
           "TEST_METRICS", "PRIVACY_NEUTRAL_KEYS"]
