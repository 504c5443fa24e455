"""A client actor imports only what training needs, and the pool starts while the server plans."""

from __future__ import annotations

import os

import numpy as np
import pytest

from raysim.allocator import GOMP_SPINCOUNT
from raysim.config import config_from_dict
from raysim.data import load_dataset

#: Runs Python subprocesses: a ``make test-cluster`` test.
pytestmark = pytest.mark.cluster


#: Server-side or user-facing packages that must never load in a client actor.
FORBIDDEN = ("pandas", "pyarrow", "matplotlib", "sklearn", "raysim.cli", "raysim.experiment", "raysim.results",
             "raysim.simulation", "raysim.analysis", "raysim.privacy.accounting", "dp_accounting", "opacus")


def test_client_actor_import_path(ray_session):
    from raysim.runtime.client_actor import ClientActor
    from raysim.messages import ClientData, ClientTask, RoundPayload
    from raysim.run_plan import plan_run
    import torch

    cfg = config_from_dict({"method": "fedsa", "num_clients": 2, "privacy": {"noise_multiplier": 1.0}})
    train = load_dataset("digits", "train", None)
    actor = ClientActor.remote()
    train_ref = [ray_session.put(train)]
    try:
        # Train one client first: the import path is what a round needs, not just the constructor.
        from raysim.models import model_for
        weights = torch.nn.utils.parameters_to_vector(model_for(cfg, train.info).parameters()).detach()
        shard = ClientData(0, np.arange(64), np.arange(64, 70))
        result = ray_session.get(actor.train.remote(RoundPayload(1, weights, weights), ClientTask(0, 1, 1.0, 1.0), shard,
                                                    ("run-a", plan_run(cfg), train_ref)))
        assert result.client_id == 0 and result.num_samples == 64
        loaded = set(ray_session.get(actor.modules.remote()))
        spin = ray_session.get(actor.__ray_call__.remote(lambda self: __import__("os").environ.get("GOMP_SPINCOUNT")))
    finally:
        ray_session.kill(actor)
    # Ray's own serialization context imports pyarrow in every worker that deserialises an argument
    # (ray/util/serialization_addons.py registers Arrow serializers); raysim's import path does not,
    # which test_actor_module_import_path checks in a fresh interpreter.
    present = [m for m in FORBIDDEN if m != "pyarrow" and _loaded(m, loaded)]
    assert not present, f"a client actor imported {present}"
    assert "torch" in loaded and "raysim.client" in loaded
    assert spin == os.environ.get("GOMP_SPINCOUNT", GOMP_SPINCOUNT)   # set before torch loaded (spin_less)


def _loaded(module: str, names: set[str]) -> bool:
    return module in names or any(name.startswith(module + ".") for name in names)


#: Modules that load no torch by themselves: the client actor's (torch comes with its first task or
#: ``warm``), and the pool's and the driver actor's, which a sweep's pool actor loads to start actors.
LIGHT = ("raysim.runtime.client_actor", "raysim.runtime.pool", "raysim.runtime.driver")


@pytest.mark.parametrize("module", ["raysim.runtime.ray_executor", *LIGHT])
def test_actor_module_import_path(module):
    """What the executor's, the actor's, the pool's and the driver's modules pull in by themselves,
    pyarrow included."""
    import subprocess
    import sys
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    forbidden = FORBIDDEN + (("torch", "raysim.client") if module in LIGHT else ())
    present = [m for m in forbidden if _loaded(m, out)]
    assert not present, f"{module} imports {present}"


def test_a_sweeps_pool_starts_actors_without_torch(ray_session):
    """The pool actor lends a run its driver actor and client actors, creating them; it never trains,
    so it loads no torch (its start is on the path of a sweep's first run). A whole Config would
    import every method's module, torch with them: the pool is sent an ActorNeeds."""
    from raysim.runtime.client_actor import ActorNeeds
    from raysim.runtime.driver import DriverActor
    from raysim.runtime.pool import ActorPool

    cfg = config_from_dict({"method": "fedavg", "num_clients": 2,
                            "runtime": {"executor": "ray", "num_actors": 2, "num_cpus_per_client": 0.5}})
    pool = ActorPool.remote()
    handles = []
    try:
        driver, actors, warm = ray_session.get(pool.acquire.remote(ActorNeeds.of(cfg), DriverActor))
        handles = [driver, *actors]
        assert not warm and len(actors) == 2
        assert ray_session.get(driver.ready.remote()) and all(ray_session.get([a.ready.remote() for a in actors]))
        loaded = set(ray_session.get(pool.modules.remote()))
    finally:
        for h in [*handles, pool]:
            ray_session.kill(h)
    present = [m for m in FORBIDDEN + ("torch", "raysim.client") if m != "pyarrow" and _loaded(m, loaded)]
    assert not present, f"the pool actor imported {present}"


def test_reserve_actors_stay_light(ray_session):
    """On 2 CPUs a run with 4 actors trains on 2 (active_actors); start-up warms those and leaves
    the other 2 without torch, and the round's results do not depend on it."""
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.run_plan import plan_run

    cfg = config_from_dict({"method": "fedavg", "num_clients": 4, "rounds": 1,
                            "runtime": {"executor": "ray", "num_actors": 4, "num_cpus_per_client": 0.5}})
    train = load_dataset("digits", "train", None)
    ex = RayExecutor()
    try:
        ex.start(plan_run(cfg), train)
        ex.ready()
        active = {id(a) for a in ex.active_actors()}
        assert len(active) == 2
        has_torch = [("torch" in ray_session.get(a.modules.remote()), id(a) in active) for a in ex.actors]
    finally:
        ex.shutdown()
    assert all(loaded == is_active for loaded, is_active in has_torch), has_torch


def test_shard_mismatch_is_refused():
    from raysim.client import ClientRunner
    from raysim.messages import ClientData, ClientTask, RoundPayload
    import torch

    cfg = config_from_dict({"method": "fedavg", "num_clients": 2})
    train = load_dataset("digits", "train", None)
    runner = ClientRunner(cfg, "none", train)
    w = torch.nn.utils.parameters_to_vector(runner.model.parameters()).detach()
    with pytest.raises(ValueError, match="shard of client 1"):
        runner.train(RoundPayload(1, w, w), ClientTask(0, 1, 1.0, 0.0), ClientData(1, np.arange(4), np.arange(0)))
