"""A method is one file: this test defines a whole method here, with its own parameter, one noised
upload and one logged column, and runs it end to end. Nothing outside this file knows about it: its
config section is parsed through the registry, its upload is accounted in every client's ledger and
in σ calibration, and its column shows up in the results tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pytest
import torch

from raysim.algorithms.base import Aggregate, MethodSpec, Server
from raysim.algorithms.registry import all_methods, get_method, register, unregister
from raysim.algorithms.uploads import Release, Upload, UploadContext
from raysim.config import Config, ConfigError, config_from_dict, fail
from raysim.messages import ClientResult
from raysim.privacy.plan import side_channels
from raysim.results import read_table
from raysim.results.schema import SCHEMAS
from raysim.runtime import execute

pytestmark = pytest.mark.simulation


# --------------------------------------------------------------------------- the method, in full

@dataclass(frozen=True)
class ShrinkParams:
    """``shrink.*``: how far the server moves towards the FedAvg aggregate, and σ of the upload."""

    factor: float = 0.5
    noise_multiplier: float = 10.0

    def check(self, cfg: Config) -> None:
        if not 0 < self.factor <= 1:
            fail("shrink.factor", f"must be in (0, 1], got {self.factor}")
        if not self.noise_multiplier > 0:
            fail("shrink.noise_multiplier", f"must be > 0, got {self.noise_multiplier}")


def _noised_clipped_fraction(ctx: UploadContext) -> float:
    """The fraction of the round's examples that were clipped (in [0, 1]: sensitivity 1), plus
    N(0, σ²) from the client's own stream."""
    return float(ctx.frac_clipped + ctx.cfg.shrink.noise_multiplier * ctx.rng("shrink-noise").standard_normal())


def shrink_uploads(cfg: Config) -> tuple[Upload, ...]:
    return (Upload("clipped_signal", "fraction of examples clipped, noised", _noised_clipped_fraction,
                   Release("gaussian", cfg.shrink.noise_multiplier), ("shrink_signal",)),)


class ShrinkServer(Server):
    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        agg = super().aggregate(server_round, global_weights, results)
        agg.global_weights = global_weights + self.cfg.shrink.factor * (agg.global_weights - global_weights)
        for row, r in zip(agg.client_logs, results):
            row["shrink_signal"] = float(r.uploads["clipped_signal"])
        return agg


SHRINK = MethodSpec(name="shrink", summary="FedAvg step shrunk by shrink.factor (a test method)", source="this test",
                    server=ShrinkServer, private=True, uploads=shrink_uploads, params={"shrink": ShrinkParams},
                    client_columns=(("shrink_signal", "float64"),))


# --------------------------------------------------------------------------- the proof

@pytest.fixture
def shrink():
    register(SHRINK)
    yield SHRINK
    unregister("shrink")


def _cfg(method: str, **extra):
    return config_from_dict({"method": method, "rounds": 2, "seed": 0, "num_clients": 3, "batch_size": 32,
                             "lr": 0.05, "privacy": {"epsilon": 8.0},
                             "data": {"name": "digits", "alpha": 0.5, "min_samples_per_client": 20,
                                      "test_subsample": 100},
                             "runtime": {"executor": "serial"}, **extra})


def test_the_section_is_parsed_and_checked_through_the_registry(shrink):
    assert get_method("shrink") is shrink and shrink in all_methods()
    assert _cfg("shrink").shrink.factor == 0.5
    assert _cfg("shrink", shrink={"factor": 0.25}).shrink.factor == 0.25
    with pytest.raises(ConfigError, match="'shrink.factor': must be in"):
        _cfg("shrink", shrink={"factor": 2.0})
    with pytest.raises(ConfigError, match="'shrink.bogus': unknown key"):
        _cfg("shrink", shrink={"bogus": 1})


def test_the_method_runs_end_to_end_is_accounted_and_shows_up_in_the_tables(shrink, tmp_path):
    cfg = _cfg("shrink", shrink={"factor": 0.25})
    assert [(c.name, c.noise_multiplier) for c in side_channels(shrink, cfg)] == [("clipped_signal", 10.0)]
    assert "shrink_signal" in SCHEMAS["clients"].names
    execute(cfg, str(tmp_path / "shrink"))
    execute(_cfg("fedsa"), str(tmp_path / "fedsa"))
    runs = read_table(str(tmp_path / "shrink"), "runs")
    clients = read_table(str(tmp_path / "shrink"), "clients")
    assert runs["status"].item() == "completed" and runs["rounds_completed"].item() == 2
    assert clients["shrink_signal"].notna().all() and len(clients) == 3 * 2
    # accounted: the run still ends within ε = 8, and the upload's Gaussian release costs budget, so the
    # calibrated DP-SGD σ is larger than FedSA's on the same federation
    assert runs["epsilon"].item() <= 8.0 + 1e-9
    fedsa = read_table(str(tmp_path / "fedsa"), "runs")
    assert runs["noise_multiplier"].item() > fedsa["noise_multiplier"].item()
    assert "clipped_signal" not in runs["not_covered_by_epsilon"].item()


def test_unregistered_the_method_and_its_section_are_gone():
    register(SHRINK)
    unregister("shrink")
    assert "shrink" not in {m.name for m in all_methods()}
    assert "shrink_signal" not in SCHEMAS["clients"].names
    with pytest.raises(ConfigError, match="'shrink': unknown key"):
        _cfg("fedsa", shrink={"factor": 0.5})
