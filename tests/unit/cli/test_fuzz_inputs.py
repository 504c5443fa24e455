"""Bad input never gives a traceback: fuzzed configs, sweeps, data files and result folders through the
CLI end in a valid plan (exit 0) or one line on stderr naming the key or file (exit 2)."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raysim.cli import main
from raysim.config import read_yaml
from tests.conftest import REPO

QUICKSTART = read_yaml(REPO / "experiments" / "quickstart.yaml")
KEYS = ["method", "rounds", "seed", "num_clients", "batch_size", "lr", "local_epochs", "privacy.epsilon",
        "privacy.delta", "privacy.noise_multiplier", "privacy.clipping", "privacy.clip_norm", "data.name",
        "data.alpha", "data.partition", "data.val_fraction", "data.server_holdout", "data.min_samples_per_client",
        "adpc.quantile", "adpc.histogram_bins", "adpc.histogram_min", "adpc.histogram_noise_multiplier",
        "cra.utility", "feddimdp.adpc", "runtime.executor", "runtime.num_actors", "bogus", "data.bogus", "data"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.sampled_from([0, 1, -1, 2**63, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["feddimdp", "fedsa", "per_sample", "batch", "digits", "cifar10", "1e-5", "nan", "inf"]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _set(values: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = values
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def _one_line_or_ok(code: int, capsys) -> None:
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), err
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.startswith("raysim: error:")]
        assert len(lines) == 1 and "Traceback" not in err, err
        named = [k.split(".")[-1] for k in KEYS] + ["config", "sweep", ".yaml", "grid", "base", "overrides"]
        assert any(word in lines[0] for word in named), f"names no key or file: {lines[0]}"


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3))
def test_fuzzed_run_configs(tmp_path_factory, capsys, changes):
    values = yaml.safe_load(yaml.safe_dump(QUICKSTART))
    values["method"] = "feddimdp"
    for key, value in changes:
        _set(values, key, value)
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(yaml.safe_dump(values))
    _one_line_or_ok(main(["run", str(path), "--dry-run"]), capsys)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["name", "base", "grid", "overrides", "bogus"]),
                       st.one_of(VALUES, st.just({"method": ["fedsa", "feddimdp"], "seed": [0, 1]}),
                                 st.just([{"when": {"method": "fedsa"}, "set": {"privacy.epsilon": 8}}]),
                                 st.just({"rounds": 2, "privacy": {"epsilon": 8}})), max_size=4))
def test_fuzzed_sweep_files(tmp_path_factory, capsys, sweep):
    path = tmp_path_factory.mktemp("sweep") / "s.yaml"
    path.write_text(yaml.safe_dump(sweep))
    _one_line_or_ok(main(["sweep", str(path), "--dry-run", "--results-dir", str(path.parent / "r")]), capsys)


def test_non_string_keys_and_non_mapping_yaml(tmp_path, capsys):
    for text in ("{1: 2}", "- a\n- b\n", "method: [fedsa, {x: 1}]", "data: {1.5: x}", ":::"):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        _one_line_or_ok(main(["run", str(path), "--dry-run"]), capsys)


def _hf_parquet(path: Path, rows: int = 4) -> None:
    from PIL import Image
    import io
    blobs = []
    for i in range(rows):
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), (i, i, i)).save(buf, format="PNG")
        blobs.append({"bytes": buf.getvalue(), "path": None})
    pq.write_table(pa.table({"img": blobs, "label": list(range(rows))}), path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong-schema", "bad-image"])
def test_corrupt_data_files_name_the_file(tmp_path, capsys, monkeypatch, damage):
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "data" / "cifar10"
    root.mkdir(parents=True)
    for split in ("train", "test"):
        _hf_parquet(root / f"{split}-00000-of-00001.parquet")
    bad = root / "train-00000-of-00001.parquet"
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif damage == "garbage":
        bad.write_bytes(b"not a parquet file at all")
    elif damage == "wrong-schema":
        pq.write_table(pa.table({"pixels": [1, 2], "y": [0, 1]}), bad)
    else:
        pq.write_table(pa.table({"img": [{"bytes": b"\x89PNG broken", "path": None}], "label": [0]}), bad)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**QUICKSTART, "method": "fedsa", "data": {"name": "cifar10"}}))
    code = main(["run", str(cfg), "--dry-run", "--data-root", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and str(bad) in err, err


@pytest.mark.parametrize("table", ["runs", "rounds"])
def test_truncated_results_file_names_the_file(tmp_path, capsys, table):
    from raysim.results import ResultsSink
    sink = ResultsSink(str(tmp_path))
    sink.write_run({"run_id": "r1", "method": "fedsa", "status": "completed", "epsilon": math.inf})
    sink.write_round("r1", 1, {"round": 1, "test_accuracy": 0.5, "test_f1": 0.5, "test_loss": 1.0, "epsilon": 1.0},
                     [{"round": 1, "client_id": 0}])
    bad = next((tmp_path / table).glob("*.parquet"))
    bad.write_bytes(bad.read_bytes()[:20])
    code = main(["report", str(tmp_path), "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and str(bad) in err, err


def test_truncated_runs_file_stops_sweep_resume_with_its_name(tmp_path, capsys):
    from raysim.run_plan import run_id_for
    from raysim.results import ResultsSink
    from raysim.sweep import load_sweep
    smoke = REPO / "experiments" / "sweeps" / "smoke.yaml"
    run_id = run_id_for(load_sweep(smoke).configs[0])
    sink = ResultsSink(str(tmp_path))
    sink.write_run({"run_id": run_id, "method": "fedavg", "status": "running"})
    bad = tmp_path / "runs" / f"{run_id}.parquet"
    bad.write_bytes(bad.read_bytes()[:30])
    code = main(["sweep", str(smoke), "--results-dir", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and str(bad) in err, err
