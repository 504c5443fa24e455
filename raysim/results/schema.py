"""Schemas of the result tables (docs/architecture.md, "Results").

The runs, partitions and tuning tables are fixed. The rounds and clients tables are the generic
columns below plus the columns every registered method declares it logs
(``MethodSpec.round_columns`` / ``client_columns``). Every file of a table has the full schema, with
nulls where a method does not log a column, so a results folder mixing methods reads as one table
and no column is dropped by schema inference. A row with an unknown column is an error, not
silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa

F64, I64, STR = pa.float64(), pa.int64(), pa.string()

RUNS = pa.schema([
    ("run_id", STR), ("sweep_id", STR), ("method", STR), ("dataset", STR), ("partition", STR), ("alpha", F64),
    ("seed", I64), ("num_clients", I64), ("rounds", I64), ("config", STR), ("status", STR), ("error", STR),
    ("diverged", pa.bool_()),                      # failed because training diverged (raysim.simulation.TrainingDiverged)
    ("start_time", pa.timestamp("us", tz="UTC")), ("end_time", pa.timestamp("us", tz="UTC")),
    ("rounds_completed", I64), ("final_test_accuracy", F64), ("final_test_f1", F64), ("final_test_loss", F64),
    ("best_test_accuracy", F64), ("best_test_f1", F64),
    ("final_val_accuracy", F64), ("final_val_f1", F64),   # on the public server hold-out (null without one)
    ("epsilon", F64), ("delta", F64), ("noise_multiplier", F64),
    ("privacy_unit", STR),     # what ε protects: example (one example of one client) | client (one whole client)
    ("adjacency", STR),        # the neighbouring relation ε is for (client unit: implied by the cohorts)
    ("privacy_mechanism", STR),    # the noise: gaussian (independent), tree, blt or bandmf (client unit)
    ("participation", STR),    # how each round's clients are drawn (e.g. cyclic poisson, with its groups and rate)
    ("epsilon_scope", STR),    # whose ε it is: per-client | population | deployment (raysim.privacy.population)
    ("epsilon_scope_detail", STR),   # the same in words (the deployment's and the simulation's sizes)
    ("clipping", STR), ("accountant", STR), ("not_covered_by_epsilon", STR), ("num_params", I64),
    ("epsilon_exceptions", STR),   # the uploads ε does not cover, by their privacy.allow_uncovered keys ("" : none)
    ("wall_seconds", F64), ("code_version", STR), ("hostname", STR),
    ("client_nodes", STR), ("writer_node", STR),   # Ray node ids: client actors (JSON list), row writer
    ("startup_seconds", F64),                      # Simulation construction until every client worker is ready
    ("warm_actors", pa.bool_()),                   # Ray: actors borrowed from a sweep's warm pool
    ("head_start_clients", I64),   # Ray with the head start: clients (one per round trained) trained in the
                                   # launching process before the actors were warm; null without a head start
    ("rdp_epsilons", STR),   # DP runs: JSON list, max over clients of the RDP curve at raysim.privacy.tuning.ORDERS
])

#: Generic columns of the rounds table (every method's rounds have them).
ROUNDS_BASE = pa.schema([
    ("run_id", STR), ("round", I64), ("participants", I64),   # clients that trained in the round
    ("test_accuracy", F64), ("test_f1", F64), ("test_loss", F64),
    ("val_accuracy", F64), ("val_f1", F64),   # the public server hold-out (NaN without one, or between evaluations)
    ("clip_norm", F64), ("epsilon", F64), ("epsilon_scope", STR),   # the runs table's epsilon_scope
    ("mean_train_loss", F64), ("round_seconds", F64),
    ("client_train_seconds", F64), ("communication_seconds", F64), ("aggregation_seconds", F64),
    ("accounting_seconds", F64), ("eval_seconds", F64),
    # client unit: ‖un-noised aggregate‖ / ‖noise added to it‖ of the round's release (a simulation diagnostic)
    ("release_snr", F64),
])

#: Generic columns of the clients table.
CLIENTS_BASE = pa.schema([
    ("run_id", STR), ("round", I64), ("client_id", I64), ("num_samples", I64), ("num_steps", I64),
    ("train_loss", F64), ("update_norm", F64), ("frac_clipped", F64), ("clip_norm", F64), ("noise_multiplier", F64),
    ("epsilon", F64), ("epsilon_scope", STR), ("aggregation_weight", F64), ("client_seconds", F64),
])

PARTITIONS = pa.schema([
    ("run_id", STR), ("client_id", I64), ("user", STR), ("label", I64), ("count", I64), ("split", STR),
])

#: ``raysim tune``: one row per planned run of a tune (stage search | final | fixed | private).
TUNING = pa.schema([
    ("tune_id", STR), ("tune_name", STR), ("contestant", STR), ("method", STR), ("stage", STR),
    ("candidate", STR), ("params", STR),           # the searched keys and values: a label, and JSON
    ("lr", F64), ("clip_norm", F64), ("seed", I64), ("draw", I64),   # draw: the replicate of a private-mode draw
    ("run_id", STR), ("status", STR),              # completed | diverged | failed | missing
    ("objective_name", STR), ("objective", F64),   # the run's validation objective (server hold-out)
    ("candidate_objective", F64),                  # search: the candidate's mean objective over the tuning seeds
    ("test_accuracy", F64), ("test_f1", F64), ("epsilon", F64),
    ("epsilon_scope", STR),                        # whose ε it is (the runs table's epsilon_scope)
    ("epsilon_exceptions", STR),                   # the uploads ε does not cover (privacy.allow_uncovered)
    ("released_epsilon", F64),                     # private: ε of the released model, tuning included
    ("reference", STR), ("private", pa.bool_()),   # the tune's reference contestant and mode
    ("chosen", pa.bool_()),                        # search: the chosen candidate; private: the released draw;
                                                   # final/fixed: every run (all are reported)
])

_FIXED = {"runs": RUNS, "partitions": PARTITIONS, "tuning": TUNING}
_BASE = {"rounds": ROUNDS_BASE, "clients": CLIENTS_BASE}
TABLES = ("runs", "rounds", "clients", "partitions", "tuning")


def method_columns(table: str) -> list[tuple[str, str, str]]:
    """(column, Arrow type name, method) that the registered methods declare for ``table`` (rounds or
    clients), by method name, each column once."""
    from raysim.algorithms.registry import all_methods   # the results layer reads the methods' declarations

    out: list[tuple[str, str, str]] = []
    for spec in all_methods():
        out.extend((column, type_name, spec.name)
                   for column, type_name in (spec.round_columns if table == "rounds" else spec.client_columns))
    return out


def table_schema(name: str) -> pa.Schema:
    """The full schema of table ``name``."""
    if name in _FIXED:
        return _FIXED[name]
    if name not in _BASE:
        raise KeyError(name)
    fields = list(_BASE[name])
    seen = {f.name: (f.type, "raysim") for f in fields}
    for column, type_name, method in method_columns(name):
        dtype = pa.type_for_alias(type_name)
        if column in seen:
            if seen[column][0] != dtype:
                raise ValueError(f"{name} column {column!r}: {method} declares {dtype}, {seen[column][1]} "
                                 f"declares {seen[column][0]}")
            continue
        seen[column] = (dtype, method)
        fields.append(pa.field(column, dtype))
    return pa.schema(fields)


class _Schemas(Mapping[str, pa.Schema]):
    """Table name -> its schema, built when asked (the registered methods may change)."""

    def __getitem__(self, name: str) -> pa.Schema:
        return table_schema(name)

    def __iter__(self) -> Iterator[str]:
        return iter(TABLES)

    def __len__(self) -> int:
        return len(TABLES)


SCHEMAS: Mapping[str, pa.Schema] = _Schemas()
