"""``raysim tune``'s choice reads the validation hold-out only, never the test split."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysim.experiment import prepare
from raysim.runtime import execute
from raysim.tune import choose, parse_tune, search_runs

pytestmark = pytest.mark.simulation



def test_poisoned_test_labels_do_not_change_the_choice(tmp_path):
    tune = parse_tune({
        "base": {"rounds": 2, "num_clients": 4, "batch_size": 32, "privacy": {"epsilon": 8.0},
                 "data": {"name": "digits", "server_holdout": 150, "min_samples_per_client": 20},
                 "runtime": {"executor": "serial"}},
        "methods": ["fedsa"], "space": {"lr": [0.01, 0.1, 0.5]}, "tuning_seeds": [7], "final_seeds": [0],
    }, name="poison")
    runs = search_runs(tune)
    train, test = prepare(runs[0].cfg)
    poisoned = dataclasses.replace(test, y=(test.y + 1) % test.info.num_classes)   # every test label wrong
    rows = {}
    for name, data in (("clean", (train, test)), ("poisoned", (train, poisoned))):
        rows[name] = {r.run_id: execute(r.cfg, str(tmp_path / name), data=data).row for r in runs}
    clean, bad = rows["clean"], rows["poisoned"]
    assert choose(tune, runs, clean) == choose(tune, runs, bad)
    for run_id in clean:
        assert clean[run_id]["final_val_accuracy"] == bad[run_id]["final_val_accuracy"]
    # the poisoning reached the test metrics (a model that predicts one class may score the same on both)
    assert sum(clean[i]["final_test_accuracy"] != bad[i]["final_test_accuracy"] for i in clean) >= 2
    vals = [clean[r.run_id]["final_val_accuracy"] for r in runs]
    assert len(set(vals)) == 3 and np.isfinite(vals).all()   # the candidates really differ on validation


def test_private_tune_releases_the_best_draw_and_bounds_it_with_papernot_steinke(tmp_path):
    from raysim.cli.tune import private_epsilons
    from raysim.privacy.tuning import ORDERS, rdp_from_json, tuned_epsilon
    from raysim.tune import private_runs, released
    tune = parse_tune({
        "base": {"rounds": 2, "num_clients": 4, "batch_size": 32, "privacy": {"epsilon": 4.0},
                 "data": {"name": "digits", "server_holdout": 150, "min_samples_per_client": 20},
                 "runtime": {"executor": "serial"}},
        "methods": ["fedsa"], "space": {"lr": [0.05, 0.3]}, "final_seeds": [3], "private": True,
        "candidates": {"distribution": "truncated_negative_binomial", "eta": 1, "mean": 2},
    }, name="private")
    runs = private_runs(tune)
    rows = {r.run_id: execute(r.cfg, str(tmp_path)).row for r in runs}
    draws = [r for r in runs if r.stage == "private"]
    best = released(tune, runs, rows)[("fedsa", 3)]
    assert rows[best.run_id]["final_val_accuracy"] == max(rows[r.run_id]["final_val_accuracy"] for r in draws)
    curves = [rdp_from_json(rows[r.run_id]["rdp_epsilons"]) for r in draws]
    eps = private_epsilons(tune, runs, rows)[("fedsa", 3)]
    assert eps == tuned_epsilon(curves, ORDERS, 1e-5, tune.count)
    assert eps > max(rows[r.run_id]["epsilon"] for r in draws)   # tuning costs privacy
