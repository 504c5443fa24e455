"""The paper's reported numbers, kept only to print next to ours.

Source: Table I (methods) and Table II (ablations) of the FedDimDP paper (arXiv 2602.06838,
withdrawn). Each cell is (test accuracy, macro-F1). These are the paper's *claims*, for settings it
does not fully state (docs/methods.md, "The paper's numbers"); the project never tunes a method
towards them.
"""

from __future__ import annotations

# dataset names as used by raysim.data (column order of the paper's tables)
PAPER_DATASETS: tuple[str, ...] = ("cifar10", "svhn", "stl10")

DATASET_LABELS: dict[str, str] = {"cifar10": "CIFAR-10", "svhn": "SVHN", "stl10": "STL-10", "digits": "digits"}

# our method name -> the paper's row label, in the paper's row order
TABLE1_METHODS: dict[str, str] = {
    "dp-fedsam": "DP-FedSAM",
    "dp-acdn": "DP-ACDN",
    "fedacg": "FedACG",
    "awdp-fl": "AWDP-FL",
    "fedsa": "FedSA",
    "feddimdp": "FedDimDP",
}

TABLE2_METHODS: dict[str, str] = {
    "feddimdp": "FedDimDP",
    "feddimdp-no-cra": "FedDimDP w/o-CRA",
    "feddimdp-no-adpc": "FedDimDP w/o-ADPC",
    "feddimdp-no-lldm": "FedDimDP w/o-LLDM",
}

# labels for methods that are not in the paper's tables (shown below the paper's rows)
OTHER_METHOD_LABELS: dict[str, str] = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "dp-fedavg-adaptive": "DP-FedAvg (adaptive quantile clipping)",
}

# paper Table I: method -> dataset -> (accuracy, macro-F1)
PAPER_TABLE1: dict[str, dict[str, tuple[float, float]]] = {
    "dp-fedsam": {"cifar10": (0.742, 0.742), "svhn": (0.786, 0.860), "stl10": (0.577, 0.581)},
    "dp-acdn": {"cifar10": (0.707, 0.708), "svhn": (0.777, 0.833), "stl10": (0.623, 0.624)},
    "fedacg": {"cifar10": (0.684, 0.682), "svhn": (0.880, 0.874), "stl10": (0.583, 0.585)},
    "awdp-fl": {"cifar10": (0.564, 0.558), "svhn": (0.798, 0.769), "stl10": (0.553, 0.555)},
    "fedsa": {"cifar10": (0.522, 0.493), "svhn": (0.769, 0.762), "stl10": (0.519, 0.527)},
    "feddimdp": {"cifar10": (0.811, 0.809), "svhn": (0.897, 0.890), "stl10": (0.652, 0.650)},
}

# paper Table II (ablation): method -> dataset -> (accuracy, macro-F1)
PAPER_TABLE2: dict[str, dict[str, tuple[float, float]]] = {
    "feddimdp": PAPER_TABLE1["feddimdp"],
    "feddimdp-no-cra": {"cifar10": (0.722, 0.600), "svhn": (0.863, 0.848), "stl10": (0.597, 0.587)},
    "feddimdp-no-adpc": {"cifar10": (0.794, 0.791), "svhn": (0.878, 0.867), "stl10": (0.650, 0.648)},
    "feddimdp-no-lldm": {"cifar10": (0.736, 0.736), "svhn": (0.817, 0.802), "stl10": (0.618, 0.610)},
}


def method_label(method: str) -> str:
    """The paper's name for one of our methods, or a readable name for the others."""
    return {**TABLE1_METHODS, **TABLE2_METHODS, **OTHER_METHOD_LABELS}.get(method, method)


def dataset_label(dataset: str) -> str:
    return DATASET_LABELS.get(dataset, dataset)
