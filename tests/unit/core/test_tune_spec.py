"""Tune files: parsing, the search space, seeds, choosing on validation, and the intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from raysim.config import ConfigError
from raysim.tune import (Candidate, candidates, choose, edge_choices, final_runs, mean_ci, parse_tune, search_runs,
                         space_of, summarise, tuning_rows)

BASE = {"rounds": 2, "num_clients": 4, "batch_size": 32, "lr": 0.1, "privacy": {"epsilon": 8.0},
        "data": {"name": "digits", "server_holdout": 100, "min_samples_per_client": 20},
        "runtime": {"executor": "serial"}}


def spec(**changes):
    values = {"base": BASE, "methods": ["fedsa", "feddimdp"], "space": {"lr": [0.05, 0.1, 0.2]},
              "tuning_seeds": [10, 11], "final_seeds": [0, 1, 2], "reference": "fedsa"}
    values.update(changes)
    return parse_tune(values, name="t")


def test_final_seeds_must_be_disjoint_from_tuning_seeds():
    with pytest.raises(ConfigError, match="disjoint"):
        spec(tuning_seeds=[1, 2], final_seeds=[2, 3])
    tune = spec()
    runs = search_runs(tune)
    assert {r.seed for r in runs} == {10, 11}
    final = final_runs(tune, {"fedsa": Candidate((("lr", 0.2),)), "feddimdp": None})
    assert {r.seed for r in final} == {0, 1, 2}
    assert not {r.seed for r in runs} & {r.seed for r in final}


@pytest.mark.parametrize("changes, message", [
    ({"objective": "test_accuracy"}, "objective"),
    ({"methods": []}, "methods"),
    ({"search": "random"}, "budget"),
    ({"space": {"lr": {"log": [0.1, 0.01], "num": 3}}}, "lo < hi"),
    ({"space": {"lr": {"log": [0.01, 0.1]}}}, "num >= 2"),
    ({"reference": "fedavg"}, "reference"),
    ({"frobnicate": 1}, "unknown key"),
    ({"base": {**BASE, "data": {"name": "digits"}}}, "server_holdout"),
    ({"space": {"lr": [0.1], "no_such_key": [1]}}, "no_such_key"),
])
def test_bad_tune_files_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message) as info:
        spec(**changes)
    assert "\n" not in str(info.value)


def test_default_space_is_a_30x_log_grid_around_the_base_lr_and_clip_only_for_fixed_clip_methods():
    tune = spec(space={"privacy.clip_norm": [0.5, 2.0]},
                methods=["fedsa", "feddimdp", "feddimdp-no-adpc", "dp-fedavg-adaptive"])
    by = {c.label: dict(space_of(tune, c)) for c in tune.contestants}
    lrs = [c.as_dict()["lr"] for c in candidates(tune, tune.contestants[0])]
    assert len(set(lrs)) == 5 and max(lrs) / min(lrs) == pytest.approx(30, rel=1e-4)
    assert math.sqrt(max(lrs) * min(lrs)) == pytest.approx(0.1, rel=1e-4)
    assert "privacy.clip_norm" in by["fedsa"] and "privacy.clip_norm" in by["feddimdp-no-adpc"]
    assert "privacy.clip_norm" not in by["feddimdp"] and "privacy.clip_norm" not in by["dp-fedavg-adaptive"]
    assert len(candidates(tune, tune.contestants[0])) == 10


def test_random_search_is_seeded_distinct_and_within_bounds():
    tune = spec(search="random", budget=6, space={"lr": {"log": [0.01, 1.0]}, "privacy.clip_norm": [0.5, 1, 2]})
    a = candidates(tune, tune.contestants[0])
    assert a == candidates(tune, tune.contestants[0]) and len(set(a)) == 6
    assert all(0.01 <= c.as_dict()["lr"] <= 1.0 and c.as_dict()["privacy.clip_norm"] in (0.5, 1, 2) for c in a)
    assert candidates(spec(search="random", budget=6, search_seed=1, space={"lr": {"log": [0.01, 1.0]}}),
                      tune.contestants[0]) != a


def _rows(tune, runs, objective):
    """Fake runs rows: validation objective from ``objective(contestant, lr, seed)``; test = 1 - val."""
    rows = {}
    for r in runs:
        val = objective(r.contestant, r.cfg.lr, r.seed)
        rows[r.run_id] = None if val is None else (
            {"status": "failed", "error": "TrainingDiverged: nan", "diverged": True} if val == "diverged" else
            {"status": "completed", "final_val_accuracy": val, "final_test_accuracy": 1 - val,
             "final_test_f1": 0.5, "epsilon": 8.0})
    return rows


def test_choice_maximises_mean_validation_and_a_diverged_seed_fails_the_candidate():
    tune = spec()

    def objective(label, lr, seed):
        if label == "fedsa":
            return {0.05: 0.5, 0.1: 0.6, 0.2: 0.9 if seed == 10 else "diverged"}[lr]
        return {0.05: 0.7, 0.1: 0.6 + (seed - 10) * 0.2, 0.2: 0.1}[lr]   # 0.1: mean 0.7 ties with 0.05

    runs = search_runs(tune)
    rows = _rows(tune, runs, objective)
    chosen = choose(tune, runs, rows, "best")
    assert chosen["fedsa"].as_dict() == {"lr": 0.1}      # 0.2 has a diverged seed: failed
    assert chosen["feddimdp"].as_dict() == {"lr": 0.05}  # ties go to the first candidate
    # the one-SE rule: 0.05 and 0.1 are within one SE of each other, and 0.1 is the base lr
    assert choose(tune, runs, rows, "one_se")["feddimdp"].as_dict() == {"lr": 0.1}
    # a failed run whose error text merely looks like divergence is a failure to rerun, not a divergence
    from raysim.tune import diverged
    assert not diverged({"status": "failed", "error": "TrainingDiverged: text only"})


def test_one_se_rule_keeps_a_resolved_best_and_flags_close_calls():
    from raysim.tune.select import candidate_stats, close_calls
    from raysim.tune.stats import objective_se
    tune = spec(methods=["fedsa"], reference=None)
    runs = search_runs(tune)
    far = {0.05: 0.50, 0.1: 0.60, 0.2: 0.90}            # 0.2 clearly best: SE (hold-out 100) ≈ 0.021
    rows = _rows(tune, runs, lambda label, lr, seed: far[lr])
    assert choose(tune, runs, rows, "one_se")["fedsa"].as_dict() == {"lr": 0.2}
    assert close_calls(tune, runs, rows, choose(tune, runs, rows)) == []
    st = candidate_stats(tune, runs, rows)[("fedsa", Candidate((("lr", 0.2),)))]
    assert st.se == pytest.approx(math.sqrt(0.9 * 0.1 / 100 / 2)) and st.seeds == 2
    near = {0.05: 0.50, 0.1: 0.60, 0.2: 0.61}
    rows = _rows(tune, runs, lambda label, lr, seed: near[lr])
    assert choose(tune, runs, rows, "best")["fedsa"].as_dict() == {"lr": 0.2}
    assert choose(tune, runs, rows, "one_se")["fedsa"].as_dict() == {"lr": 0.1}
    [line] = close_calls(tune, runs, rows, {"fedsa": Candidate((("lr", 0.2),))})
    assert "within one standard error of lr=0.1" in line
    # seed spread above the hold-out's binomial floor is what the SE uses
    assert objective_se([0.5, 0.7], 100) == pytest.approx(np.std([0.5, 0.7], ddof=1) / math.sqrt(2))


def test_every_candidate_failing_leaves_no_choice_and_no_final_runs():
    tune = spec(methods=["fedsa"], reference=None)
    runs = search_runs(tune)
    chosen = choose(tune, runs, _rows(tune, runs, lambda *a: "diverged"))
    assert chosen == {"fedsa": None}
    assert {r.stage for r in final_runs(tune, chosen)} == {"fixed"}


def test_summary_intervals_and_paired_differences_match_scipy():
    tune = spec()
    chosen = {"fedsa": Candidate((("lr", 0.2),)), "feddimdp": Candidate((("lr", 0.05),))}
    final = final_runs(tune, chosen)
    test_acc = {("fedsa", 0): 0.80, ("fedsa", 1): 0.70, ("fedsa", 2): 0.75,
                ("feddimdp", 0): 0.71, ("feddimdp", 1): 0.66, ("feddimdp", 2): 0.60}
    rows = _rows(tune, final, lambda label, lr, seed: 1 - test_acc[(label, seed)])
    table = tuning_rows(tune, "tid", final, rows, {r.run_id for r in final})
    got = {r["contestant"]: r for r in summarise(table, "final")}
    x = np.array([0.71, 0.66, 0.60])
    ref = np.array([0.80, 0.70, 0.75])
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert got["feddimdp"]["mean"] == pytest.approx(x.mean())
    assert got["feddimdp"]["std"] == pytest.approx(x.std(ddof=1))
    assert (got["feddimdp"]["ci_low"], got["feddimdp"]["ci_high"]) == pytest.approx((lo, hi))
    d = x - ref
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert got["feddimdp"]["diff"] == pytest.approx(d.mean())
    assert (got["feddimdp"]["diff_low"], got["feddimdp"]["diff_high"]) == pytest.approx((ci.low, ci.high))
    assert got["feddimdp"]["paired"] == 3 and "diff" not in got["fedsa"]


def test_mean_ci_edge_cases():
    assert all(math.isnan(v) for v in mean_ci([]))
    mean, std, lo, hi = mean_ci([0.5])
    assert mean == 0.5 and math.isnan(std) and math.isnan(lo)


def private_spec(**changes):
    values = {"private": True, "candidates": {"distribution": "truncated_negative_binomial", "eta": 1, "mean": 3},
              "tuning_seeds": None}
    values.update(changes)
    return spec(**values)


def test_private_mode_draws_k_candidates_per_final_seed_each_with_its_own_training_streams():
    from raysim.tune import private_runs, released
    tune = private_spec()
    runs = private_runs(tune)
    assert runs == private_runs(tune)   # seeded
    for c in tune.contestants:
        for seed in tune.final_seeds:
            draws = [r for r in runs if r.stage == "private" and r.contestant == c.label and r.seed == seed]
            assert len(draws) >= 1 and [r.draw for r in draws] == list(range(1, len(draws) + 1))
            assert [r.cfg.replicate for r in draws] == [r.draw for r in draws]
            assert len({r.cfg.train_seed for r in draws}) == len(draws)          # independent training streams
            assert {r.cfg.seed for r in draws} == {seed}                          # one federation
            assert [r.stage for r in runs if r.contestant == c.label and r.seed == seed].count("fixed") == 1
    rows = _rows(tune, runs, lambda label, lr, seed: lr)                      # validation grows with lr
    best = released(tune, runs, rows)
    for (label, seed), r in best.items():
        draws = [d for d in runs if d.stage == "private" and d.contestant == label and d.seed == seed]
        assert r.cfg.lr == max(d.cfg.lr for d in draws) and r == next(d for d in draws if d.cfg.lr == r.cfg.lr)


@pytest.mark.parametrize("changes, message", [
    ({"space": {"lr": [0.1, 0.2], "batch_size": [16, 32]}}, "batch_size"),
    ({"candidates": {"distribution": "binomial"}}, "tune.candidates.distribution"),
    ({"candidates": {"distribution": "poisson", "mean": 0.5}}, "tune.candidates.mean"),
])
def test_private_mode_refuses_spaces_that_change_the_privacy_plan_and_bad_counts(changes, message):
    with pytest.raises(ConfigError, match=message):
        private_spec(**changes)


def test_the_count_distribution_needs_private_mode():
    with pytest.raises(ConfigError, match="private: true"):
        spec(candidates={"distribution": "poisson", "mean": 2})


def test_a_choice_at_the_edge_of_the_space_is_named():
    import json

    def row(label, lr, clip, chosen):
        return {"stage": "search", "contestant": label, "params": json.dumps({"lr": lr, "privacy.clip_norm": clip}),
                "chosen": chosen}
    table = [row("a", lr, c, lr == 0.3 and c == 2) for lr in (0.01, 0.03, 0.1, 0.3) for c in (1, 2)]
    table += [row("b", lr, 1, lr == 0.03) for lr in (0.01, 0.03, 0.1)]
    table += [row("c", lr, 1, lr == 0.01) for lr in (0.01, 0.1)]                  # two values: no edge to speak of
    table += [{**row("a", 0.3, 2, True), "stage": "final"}]
    assert edge_choices(table) == [
        "a: the chosen lr=0.3 is the largest of the 4 values searched; the optimum may lie above it (widen the space)"]
    table[0]["chosen"], table[7]["chosen"] = True, False                              # a picks lr 0.01, C 1
    assert [line.split(" is the ")[1][:8] for line in edge_choices(table)] == ["smallest"]


def test_the_cli_prints_adjusted_intervals_the_se_and_what_privacy_does_not_cover(capsys):
    from raysim.cli.tune import print_candidates, print_comparison, privacy_statement
    tune = spec(methods=["fedsa", "feddimdp", "fedprox"])
    chosen = {"fedsa": Candidate((("lr", 0.2),)), "feddimdp": Candidate((("lr", 0.05),)),
              "fedprox": Candidate((("lr", 0.1),))}
    final = final_runs(tune, chosen)
    test_acc = {"fedsa": [0.80, 0.70, 0.75], "feddimdp": [0.60, 0.52, 0.57], "fedprox": [0.81, 0.70, 0.76]}
    rows = _rows(tune, final, lambda label, lr, seed: 1 - test_acc[label][seed])
    table = tuning_rows(tune, "tid", final, rows, {r.run_id for r in final})
    print_comparison(tune, table, "final", "Tuned")
    out = capsys.readouterr().out
    assert "Bonferroni-adjusted CI (m = 2)" in out and "significant" in out
    got = {r["contestant"]: r for r in summarise(table, "final")}
    d = np.array(test_acc["feddimdp"]) - np.array(test_acc["fedsa"])
    half = stats.t.ppf(1 - 0.05 / 4, 2) * d.std(ddof=1) / math.sqrt(3)
    assert (got["feddimdp"]["adj_low"], got["feddimdp"]["adj_high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert got["feddimdp"]["significant"] is True and got["fedprox"]["significant"] is False
    search = search_runs(tune)
    srows = _rows(tune, search, lambda label, lr, seed: 0.6)
    print_candidates(tune, search, srows, choose(tune, search, srows))
    out = capsys.readouterr().out
    assert "lr=0.1 0.6000 ± 0.0346 *" in out and "selection: one_se" in out   # SE of 100 images, 2 seeds
    text = privacy_statement(tune, table, {"fedsa": 1e-5, "feddimdp": 1e-5, "fedprox": 1e-5},
                             {"feddimdp": "cra_val_f1 (not noised)"})
    assert "NOT included" in text and "Uploads outside ε stay outside it" in text and "cra_val_f1" in text


def test_private_statement_takes_delta_per_contestant_and_says_what_is_not_covered():
    from raysim.cli.tune import privacy_statement
    tune = private_spec()
    table = [{"stage": "private", "contestant": "fedsa", "released_epsilon": 3.2},
             {"stage": "private", "contestant": "feddimdp", "released_epsilon": 4.1}]
    text = privacy_statement(tune, table, {"fedsa": 1e-5, "feddimdp": 1e-6}, {})
    assert "fedsa ε ≤ 3.200 at δ = 1e-05" in text and "feddimdp ε ≤ 4.100 at δ = 1e-06" in text
    assert "2 draws over the 3 final seeds" in text and "validation scores and test metrics printed here are not covered" in text
    # whose ε it is, from the tuning rows' epsilon_scope
    scoped = [{**r, "epsilon_scope": "deployment" if r["contestant"] == "fedsa" else "per-client"} for r in table]
    text = privacy_statement(tune, scoped, {"fedsa": 1e-5, "feddimdp": 1e-6}, {})
    assert "fedsa ε ≤ 3.200 (deployment) at δ = 1e-05" in text and "feddimdp ε ≤ 4.100 (per-client) at δ" in text
    assert "Whose ε (epsilon_scope): fedsa: deployment; feddimdp: per-client." in text


@pytest.mark.parametrize("privacy, participation, ok", [
    ({}, "poisson", True),
    ({}, "uniform", False),                                          # fixed-size cohorts: replace-one, no curve
    ({"mechanism": "tree", "accountant": "rdp"}, "shuffle", False),
])
def test_private_mode_under_the_client_unit_needs_poisson_gaussian_rounds(privacy, participation, ok):
    base = {**BASE, "num_clients": 8, "clients_per_round": 2, "participation": participation,
            "privacy": {"epsilon": 8.0, "unit": "client", "accountant": "rdp", **privacy}}
    if ok:
        assert private_spec(base=base, methods=["fedavg"], reference=None).private
        return
    with pytest.raises(ConfigError, match="private tuning composes each run's RDP curve"):
        private_spec(base=base, methods=["fedavg"], reference=None)
