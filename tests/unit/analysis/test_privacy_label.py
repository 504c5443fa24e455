"""The report's privacy label keeps apart what must not be averaged together: the noise mechanism."""

from __future__ import annotations

import json

import pandas as pd

from analysis.load import privacy_label


def _row(privacy: dict, **columns) -> pd.Series:
    return pd.Series({"config": json.dumps({"privacy": privacy}), **columns})


def test_mechanisms_get_their_own_label():
    client = {"unit": "client", "epsilon": 8.0}
    gaussian = privacy_label(_row(client, clipping="update", privacy_mechanism="gaussian"))
    bandmf = privacy_label(_row(client, clipping="update", privacy_mechanism="bandmf"))
    assert gaussian == "ε=8 (population), client-level"
    assert bandmf == "ε=8 (population), bandmf, client-level"
    damped = {"unit": "example", "epsilon": 8.0, "mechanism": "bandmf", "workload_decay": 0.3}
    assert privacy_label(_row(damped)) == "ε=8 (per-client), bandmf η=0.3"
    assert privacy_label(_row({"unit": "example", "epsilon": 8.0})) == "ε=8 (per-client)"
