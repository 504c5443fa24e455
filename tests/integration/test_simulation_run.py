"""Simulation.run: what it keeps between rounds."""

from __future__ import annotations


def test_run_drops_a_rounds_results_before_yielding_it():
    """Simulation.run must not hold round t's model-sized deltas while round t+1's arrive (found by
    experiments/bench/population.py: +150 MiB of driver memory at 10 CIFAR-10 clients)."""
    import gc
    import weakref

    from raysim.data import load_dataset
    from raysim.runtime.serial import SerialExecutor
    from raysim.simulation import Simulation
    from tests.helpers import tiny_config

    class Spy(SerialExecutor):
        def __init__(self) -> None:
            super().__init__()
            self.refs: list[list[weakref.ref]] = []

        def collect(self, handle):
            results = super().collect(handle)
            self.refs.append([weakref.ref(r.delta) for r in results])
            return results

    spy = Spy()
    sim = Simulation(tiny_config(rounds=3), load_dataset("digits", "train", None), load_dataset("digits", "test", None), spy)
    for record in sim.run():
        gc.collect()
        assert spy.refs[-1] and all(ref() is None for ref in spy.refs[-1]), f"round {record.server_round}"
