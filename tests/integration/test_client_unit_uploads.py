"""Under ``privacy.unit: client`` an upload is covered only if the population ledger accounts it.

A method registered from a module outside raysim (loaded through the config's ``plugins`` key) uploads the
client's update norm before clipping as ``post_processing``, which the example unit would take as free
(there Δw_i is a DP output) and which under the client unit is a raw function of the mechanism's input. The
run is refused in one line naming the opt-in; with the opt-in it runs, and the exception is recorded in the
runs table and printed beside ε.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import yaml

from raysim.algorithms.registry import unregister
from raysim.cli import main
from raysim.config import config_from_dict
from raysim.results import read_table
from raysim.runtime import execute

PLUGIN = textwrap.dedent('''
    """A method that uploads each client's update norm before clipping (outside raysim)."""
    from raysim.algorithms.base import MethodSpec, Server, client_level_any
    from raysim.algorithms.registry import register
    from raysim.algorithms.uploads import Release, Upload


    def _preclip_norm(ctx):
        return float(ctx.update_norm) if ctx.update_norm is not None else float(ctx.delta.norm())


    class NormServer(Server):
        def aggregate(self, server_round, global_weights, results):
            agg = super().aggregate(server_round, global_weights, results)
            agg.round_logs["largest_preclip_norm"] = max((r.uploads["preclip_norm"] for r in results), default=0.0)
            return agg


    register(MethodSpec(
        name="norm-reader", summary="DP-FedAvg whose server reads the raw update norms (a test plugin)",
        source="a test", server=NormServer, private=True,
        uploads=lambda cfg: (Upload("preclip_norm", "the update norm before clipping", _preclip_norm,
                                    Release("post_processing")),),
        client_level=client_level_any, client_level_note="DP-FedAvg, plus the raw norms",
        round_columns=(("largest_preclip_norm", "float64"),)))
''')

MODULE = "norm_reader_plugin"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The plugin's folder on the path for this module's tests (the config's ``plugins`` key imports it once
    per process) and its method unregistered after them."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    sys.path.insert(0, str(folder))
    yield MODULE
    sys.path.remove(str(folder))
    unregister("norm-reader")


def _values(**privacy) -> dict:
    return {"plugins": [MODULE], "method": "norm-reader", "rounds": 1, "num_clients": 4, "batch_size": 32,
            "privacy": {"unit": "client", "epsilon": 8.0, **privacy},
            "data": {"name": "digits", "partition": "iid"}, "runtime": {"executor": "serial"}}


def test_a_plugins_unaccounted_upload_is_refused_in_one_line_naming_the_opt_in(plugin, tmp_path, capsys):
    config = tmp_path / "norms.yaml"
    config.write_text(yaml.safe_dump(_values()))
    assert main(["run", str(config), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "preclip_norm" in err and "privacy.unit=client does not account" in err
    assert err.endswith("opt in with privacy.allow_uncovered: [preclip_norm]")
    assert not (tmp_path / "r" / "runs").exists()


def test_with_the_opt_in_it_runs_and_epsilon_is_shown_with_the_exception(plugin, tmp_path, capsys):
    from analysis import load_results, summarise
    from raysim.cli.run import print_run_summary
    summary = execute(config_from_dict(_values(allow_uncovered=["preclip_norm"])), str(tmp_path))
    runs = read_table(str(tmp_path), "runs")
    assert runs["status"].item() == "completed" and runs["epsilon_exceptions"].item() == "preclip_norm"
    assert "preclip_norm (the update norm before clipping, a post_processing upload that privacy.unit=client " \
           "does not account)" in runs["not_covered_by_epsilon"].item()
    assert read_table(str(tmp_path), "rounds")["largest_preclip_norm"].item() > 0
    print_run_summary([summary.row], str(tmp_path))
    assert " except preclip_norm" in capsys.readouterr().out
    assert "except preclip_norm" in summarise(load_results(str(tmp_path)).runs)["privacy"].item()
