"""Several processes rewriting and reading one run's runs row at once (a run, the sweep recording its
failure, a retried attempt, the progress display): every read sees one writer's whole row."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.cluster

WRITERS, READERS, ITERATIONS = 3, 2, 300


def _writer(root: str, run_id: str, who: int) -> list[str]:
    from raysim.results import ResultsSink
    from raysim.results.rows import run_row
    from tests.helpers import tiny_config
    sink, errors = ResultsSink(root), []
    row = {**run_row(tiny_config(), None, "running"), "run_id": run_id, "error": "x" * 20_000}
    for i in range(ITERATIONS):
        try:
            sink.write_run({**row, "rounds_completed": who * ITERATIONS + i})
        except Exception as exc:   # noqa: BLE001 - the test counts every failure
            errors.append(f"write: {type(exc).__name__}: {exc}")
    return errors


def _reader(root: str, run_id: str, who: int) -> list[str]:
    from raysim.results import ResultsSink
    sink, errors = ResultsSink(root), []
    for _ in range(3 * ITERATIONS):
        try:
            row = sink.read_run(run_id)
            if row is not None and row["run_id"] != run_id:
                errors.append("read: a row of another run")
        except Exception as exc:   # noqa: BLE001
            errors.append(f"read: {type(exc).__name__}: {exc}")
    return errors


def test_concurrent_rewrites_and_reads_of_one_runs_row_never_fail(tmp_path):
    root, run_id = str(tmp_path), "fedavg-digits-s0-stress"
    ctx = mp.get_context("spawn")
    with ctx.Pool(WRITERS + READERS) as pool:
        jobs = [pool.apply_async(_writer, (root, run_id, w)) for w in range(WRITERS)]
        jobs += [pool.apply_async(_reader, (root, run_id, r)) for r in range(READERS)]
        errors = [e for job in jobs for e in job.get(timeout=600)]
    assert not errors, f"{len(errors)} failures, e.g. {errors[:3]}"
    leftovers = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
