"""A method, a data set and a model from a package outside raysim: the worked example of
docs/architecture.md ("Extending raysim from your own package"), written to a temporary folder as the
page shows it, run on Ray through its entry points, and as a Ray Jobs submission to a 2-node local
cluster through the config's ``plugins`` key. Both runs are accounted and reach the tables."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from raysim.results import read_table
from tests.integration.test_sweep_cluster import BIN, ray_env, start_two_nodes, stop_processes_under

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Extending raysim from your own package"


def example_files() -> dict[str, str]:
    """The page's ``# file: PATH`` code blocks of the section, by path."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    files = {}
    for body in re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S):
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            files[first[len("# file: "):].strip()] = rest
    return files


def write_example(folder: Path) -> None:
    for name, body in example_files().items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(body)


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> str:
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(args[:5])} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _check_results(results: Path) -> dict:
    runs = read_table(str(results), "runs")
    assert runs["status"].tolist() == ["completed"] and runs["method"].item() == "damped"
    assert runs["rounds_completed"].item() == 2
    assert 0 < runs["epsilon"].item() <= 8.0 + 1e-9             # accounted, the noised upload included
    assert "clipped_signal" not in runs["not_covered_by_epsilon"].item()
    # read as files: this test process never imported the plugin, so raysim's schemas lack its column
    clients = pd.concat([pd.read_parquet(f) for f in sorted((results / "clients").glob("*.parquet"))])
    assert len(clients) == 4 * 2 and clients["damped_signal"].notna().all()
    assert len(read_table(str(results), "rounds")) == 2
    return runs.iloc[0].to_dict()


def test_the_page_lists_the_whole_example():
    assert set(example_files()) == {"pyproject.toml", "stripes_plugin/__init__.py", "stripes.yaml"}


def test_plugin_on_ray_through_entry_points_and_as_a_ray_job_on_two_nodes(tmp_path):
    src = tmp_path / "src"
    write_example(src)
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--target", str(site), str(src)], ray_env(), tmp_path, 300)
    env = ray_env(PYTHONPATH=f"{site}")

    listing = _run([sys.executable, "-m", "raysim.cli", "methods"], env, tmp_path, 120)
    assert "from: entry point raysim.methods: damped (stripes-plugin 0.1.0)" in listing

    # 1. installed: the entry points, the Ray executor on a local Ray started by the run (without the head
    # start, whose clients of a run this short could all train in the launching process)
    local = tmp_path / "local"
    _run([sys.executable, "-m", "raysim.cli", "run", str(src / "stripes.yaml"), "--results-dir", str(local),
          "--set", "runtime.head_start=false"], env, tmp_path, 600)
    row = _check_results(local)
    assert len(json.loads(row["client_nodes"])) == 2            # two client actors: the Ray executor ran it

    # 2. not installed: the source folder is the job's working directory, the config names the module
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")   # short: Ray's socket paths must fit 107 chars
    job_env = ray_env()
    ray = str(BIN / "ray")
    remote = tmp_path / "job"
    try:
        _, dash = start_two_nodes(temp_dir, job_env, dashboard=True)
        address = f"http://127.0.0.1:{dash}"
        _run([ray, "job", "submit", "--address", address, "--working-dir", str(src), "--", sys.executable, "-m",
              "raysim.cli", "run", "stripes.yaml", "--set", "plugins=[stripes_plugin]", "--results-dir",
              str(remote)], job_env, tmp_path, 600)
        nodes = json.loads(_run([ray, "list", "nodes", "--address", address, "--format", "json"], job_env,
                                tmp_path, 60))
    finally:
        stop_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    row = _check_results(remote)
    assert {n["node_id"] for n in nodes} == set(json.loads(row["client_nodes"]))   # clients on both nodes
