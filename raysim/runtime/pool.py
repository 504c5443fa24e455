"""A sweep's pool of warm actors: runs on the same data reuse client actors and driver actors.

Starting a run's actors costs seconds (a process per actor, each importing torch); a sweep pays
it once per *kind* of run instead of once per run. Runs share a kind when they read the same
dataset and ask for the same per-actor resources (:func:`pool_key`); the train arrays stay in
the object store and in the actors, and a new run token (:class:`ClientActor`) and :meth:`DriverActor.open`
rebuild everything that belongs to a run (model, method, engine, server state), so a reused
actor gives the same result as a fresh one (``tests/integration/test_sweep_pool.py``).

An actor of a failed run is killed, not returned. Idle actors of another kind are killed when
a run needs room for its own. Pooled actors are not restarted by Ray (a restart outside any
placement group can wait forever for resources held by idle actors); an actor lost with its node
fails its run, which the sweep resumes from its checkpoint on fresh actors, after emptying the pool.
"""

from __future__ import annotations

import json
from typing import Any

import ray

from raysim.runtime.client_actor import ActorNeeds, actor_count, start_client_actors

__all__ = ["ActorPool", "pool_key"]


def pool_key(cfg: ActorNeeds) -> str:
    """Runs with equal keys can share actors: same data, same per-actor resources and restart policy."""
    d, r = cfg.data, cfg.runtime
    return json.dumps({"data": [d.name, d.root, d.cache_dir, d.train_subsample], "actors": actor_count(cfg),
                       "cpus": r.num_cpus_per_client, "gpus": r.num_gpus_per_client,
                       "gpu_memory_fraction": r.gpu_memory_fraction, "restarts": r.max_actor_restarts},
                      sort_keys=True)


def _kill(handles: list[Any]) -> None:
    for h in handles:
        if h is not None:
            ray.kill(h)


@ray.remote(num_cpus=0)
class ActorPool:
    """Lends (driver, client actors) per :func:`pool_key`; creates what is missing."""

    def __init__(self) -> None:
        self.train: dict[str, list] = {}            # key -> [ObjectRef of the train arrays]
        self.idle: dict[str, list[tuple[Any, list[Any]]]] = {}
        self.kind: dict[Any, str] = {}               # actor (driver) -> key, for release
        self.starting: list[list[Any]] = []          # ready() pings of actors created but maybe not placed yet

    def has_data(self, cfg: ActorNeeds) -> bool:
        return pool_key(cfg) in self.train

    def data(self, cfg: ActorNeeds, train_ref: list | None) -> list:
        """The train arrays of ``cfg``'s kind (the first run's reference is kept, for the runs after it)."""
        key = pool_key(cfg)
        if key not in self.train:
            if train_ref is None:
                raise KeyError(f"the pool holds no data for {key}")
            self.train[key] = train_ref
        return self.train[key]

    def acquire(self, cfg: ActorNeeds, driver_class: Any = None) -> tuple[Any, list[Any], bool]:
        """A driver actor and client actors for one run of ``cfg``'s kind, and whether they were warm.
        ``driver_class`` is the driver actor class (``raysim.runtime.driver.DriverActor``, passed in so that
        this module need not import the driver); without it (a sweep's head-start run, whose server runs in
        the sweep's process) no driver actor is created, and the one returned may be None."""
        key = pool_key(cfg)
        idle = self.idle.get(key)
        while idle:
            driver, actors = idle.pop()
            if self._alive([h for h in (driver, *actors) if h is not None]):
                if driver is None and driver_class is not None:
                    driver = driver_class.remote()
                self.kind[actors[0]] = key
                return driver, actors, True
        self._evict_other_kinds(key)
        actors = start_client_actors(cfg, restarts=False)
        driver = driver_class.remote() if driver_class is not None else None
        self.starting.append([a.ready.remote() for a in actors])
        self.kind[actors[0]] = key
        return driver, actors, False

    @staticmethod
    def _alive(handles: list[Any], timeout: float = 10.0) -> bool:
        """All of ``handles`` answer within ``timeout`` s; otherwise they are killed (a node may have died)."""
        pings = [h.ready.remote() for h in handles]
        done, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout)
        try:
            ok = len(done) == len(pings) and all(ray.get(done))
        except Exception:   # RayActorError: the actor died with its node
            ok = False
        if not ok:
            _kill(handles)
        return ok

    def flush(self) -> None:
        """Kill every idle actor (after a node died, none of them is trusted)."""
        for entries in self.idle.values():
            for driver, actors in entries:
                _kill([driver, *actors])
        self.idle = {}

    def release(self, driver: Any, actors: list[Any]) -> None:
        """Take back what :meth:`acquire` lent (``driver`` may be None)."""
        key = self.kind.pop(actors[0])
        if self._someone_waits():
            # Actors of another run are still waiting for resources: idle ones must not hold them.
            _kill([driver, *actors])
            return
        self.idle.setdefault(key, []).append((driver, list(actors)))

    def _someone_waits(self) -> bool:
        still = []
        for pings in self.starting:
            done, _ = ray.wait(pings, num_returns=len(pings), timeout=0)
            if len(done) < len(pings):
                still.append(pings)
        self.starting = still
        return bool(still)

    def discard(self, handles: list[Any]) -> None:
        """Forget a lease whose actors were killed (``handles``: its driver, if any, and client actors)."""
        for h in handles:
            if h is not None:
                self.kind.pop(h, None)

    def _evict_other_kinds(self, key: str) -> None:
        # Idle actors of another kind hold CPUs that this run's new actors may need.
        for other in [k for k in self.idle if k != key]:
            for driver, actors in self.idle.pop(other):
                _kill([driver, *actors])

    def shutdown(self) -> None:
        self.flush()
        self.train = {}

    def modules(self) -> list[str]:
        """Names in this process's ``sys.modules`` (the import-path test: it starts actors, and loads no torch)."""
        import sys
        return sorted(sys.modules)
