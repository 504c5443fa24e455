"""pfl-research on raysim's cross-device CIFAR-10 workload, timed against the same compute floor.

The workload is ``experiments/paper/cross_device_cifar10.yaml`` with ``participation=uniform`` and no
DP, the shape of pfl-research's own CIFAR-10 benchmark: raysim's 1,000 IID client shards (45 training
images each; the 5 local-validation images are not used), 50 clients a round, one local epoch at
batch 10 (5 steps), client lr 0.1 (plain SGD), FedAvg weighted by sample count, server lr 1 (pfl's
central SGD), raysim's paper CNN with raysim's initial weights for the seed, raysim's normalisation.
It is trained with pfl's public API as its benchmark (``benchmarks/image_classification/pytorch``)
does: ``FederatedDataset.from_slices`` with the ``random`` user sampler, ``SimulatedBackend``,
``FederatedAveraging``, ``PyTorchModel``. Two departures, both to keep the work equal to raysim's:
pfl's evaluation of every cohort user before and after local training in evaluation rounds (always
round 1) is switched off, and the test split is scored once, after the timed rounds. pfl iterates a
user's data in stored order, so each shard is shuffled once at set-up (raysim reshuffles it every
round). pfl's ``random`` sampler draws a cohort's users with replacement. pfl trains NCHW tensors.

Measured in one run:

* ``floor``: the compute floor exactly as ``experiments/bench/cross_device.py`` defines it (plain SGD
  over raysim's round-1 cohort, 2,250 samples at batch 10, one process, 2 threads, pre-built tensors,
  the faster of NCHW and channels-last), in this process before pfl starts.
* ``pfl``: a fresh process (``--procs 1``) or ``torchrun`` with ``--procs`` worker processes (pfl's
  multi-process simulation: each worker trains its share of the cohort, then an all-reduce over
  ``torch.distributed``/gloo), ``--threads`` torch threads each, ``--rounds`` rounds. From the launch:
  ``start_s`` (set-up done: imports, data, shards, model, process group) and ``first_round_s``
  (round 1 aggregated); ``round_s`` is the median wall time between consecutive rounds' ends
  (rounds 2..N); ``evaluated_s``: the test split scored; ``process_wall_s``: until the launch exits.

Not part of ``make bench``: pfl-research is not a dependency of raysim. Install it in a venv of its own
(pfl 0.6 pins ``packaging<26`` and ``dp-accounting<0.6``, which raysim's own venv cannot take)::

    python3.11 -m venv .venv-pfl
    .venv-pfl/bin/pip install torch==2.14.1 torchvision==0.29.1
    .venv-pfl/bin/pip install "pfl[pytorch]==0.6.0" torch==2.14.1 torchvision==0.29.1 \
        pandas==3.1.1 pyarrow==26.0.1 PyYAML==6.0.4

Run (raysim is imported from this checkout, not installed in that venv)::

    .venv-pfl/bin/python experiments/compare/pfl_cross_device.py --data-root DATA_ROOT                       # 1 x 2
    .venv-pfl/bin/python experiments/compare/pfl_cross_device.py --data-root DATA_ROOT --procs 2 --threads 1  # 2 x 1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "paper" / "cross_device_cifar10.yaml"
OVERRIDES = ["participation=uniform", "privacy.epsilon=null"]
sys.path.insert(0, str(REPO))


def raysim_config(data_root: str, rounds: int):
    from raysim.config import apply_overrides, cli_overrides, config_from_dict, read_yaml
    values = apply_overrides(read_yaml(str(CONFIG)), cli_overrides(OVERRIDES, data_root, None))
    values["rounds"] = rounds
    return config_from_dict(values)


def measure_floor(cfg, timed: int) -> dict:
    """``floor`` of ``experiments/bench/cross_device.py``, imported from that file."""
    spec = importlib.util.spec_from_file_location("cross_device", REPO / "experiments" / "bench" / "cross_device.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from raysim.experiment import prepare
    train, _ = prepare(cfg)
    return bench.floor(cfg, train, timed, 2)


# ----------------------------------------------------------------------------------------------- pfl worker

def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops import pytorch_ops
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    from raysim.algorithms.registry import get_method
    from raysim.data import to_float_tensor
    from raysim.experiment import prepare
    from raysim.models import init_parameters, model_for
    from raysim.models.cnn import CNN
    from raysim.rng import torch_generator
    from raysim.run_data import make_partition

    class PflCNN(CNN):
        """raysim's CNN with the ``loss`` and ``metrics`` methods ``PyTorchModel`` calls."""

        def loss(self, x, y, eval=False):
            self.train(not eval)
            return F.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=True):
            self.eval()
            logits = self(x)
            return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(y)),
                    "accuracy": Weighted((logits.argmax(1) == y).sum().item(), len(y))}

    class FedAvg(FederatedAveraging):
        """FedAvg without pfl's local evaluation of each cohort user in evaluation rounds."""

        def get_next_central_contexts(self, *a, **kw):
            contexts, model, metrics = super().get_next_central_contexts(*a, **kw)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
            return contexts, model, metrics

    class Stamps(TrainingProcessCallback):
        def __init__(self):
            self.setup, self.rounds = 0.0, []

        def on_train_begin(self, *, model):
            self.setup = time.time()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.rounds.append(time.time())
            return False, Metrics()

    cfg = raysim_config(args.data_root, args.rounds)
    train, test = prepare(cfg)
    clients = make_partition(cfg, train)
    # Each shard once in a seeded random order (pfl's benchmark shuffles the data once, before partitioning;
    # the split is sorted by label), one gather, then a view per client.
    rng = np.random.default_rng(cfg.seed)
    order = np.concatenate([rng.permutation(c.train_indices) for c in clients])
    sizes = [len(c.train_indices) for c in clients]
    xs = torch.split(to_float_tensor(train.x[order], train.info), sizes)
    ys = torch.split(torch.from_numpy(train.y[order].astype(np.int64)), sizes)
    users = {c.client_id: (x, y) for c, x, y in zip(clients, xs, ys)}
    np.random.seed(cfg.seed)   # the same cohorts on every worker
    torch.manual_seed(cfg.seed)
    federated = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))

    reference = model_for(cfg, train.info, get_method(cfg.method).model_options(cfg))
    init_parameters(reference, torch_generator(cfg.train_seed, "model-init"))
    assert type(reference) is CNN, type(reference)
    net = PflCNN(train.info.channels, train.info.image_size, train.info.num_classes)
    net.load_state_dict(reference.state_dict())
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=federated, val_data=federated, postprocessors=[WeightByDatapoints()])
    params = NNAlgorithmParams(central_num_iterations=cfg.rounds, evaluation_frequency=cfg.rounds,
                               train_cohort_size=cfg.clients_per_round, val_cohort_size=0)
    train_params = NNTrainHyperParams(local_learning_rate=cfg.lr, local_num_epochs=cfg.local_epochs,
                                      local_batch_size=cfg.batch_size)
    eval_params = NNEvalHyperParams(local_batch_size=cfg.eval_batch_size)
    stamps = Stamps()
    FedAvg().run(algorithm_params=params, backend=backend, model=model, model_train_params=train_params,
                 model_eval_params=eval_params, callbacks=[stamps])
    # The test split once, after the timed rounds, shared among the workers as pfl's central evaluation does.
    test_set = Dataset(raw_data=[to_float_tensor(test.x, test.info), torch.from_numpy(test.y.astype(np.int64))])
    evaluation = CentralEvaluationCallback(test_set, model_eval_params=eval_params, frequency=cfg.rounds)
    _, metrics = evaluation.after_central_iteration(Metrics(), model, central_iteration=cfg.rounds)
    if pytorch_ops.distributed.global_rank != 0:
        return
    accuracy = next(v for k, v in metrics if str(k).endswith("accuracy")).overall_value
    Path(args.out).write_text(json.dumps({"setup": stamps.setup, "rounds": stamps.rounds, "evaluated": time.time(),
                                          "accuracy": accuracy, "world_size": pytorch_ops.distributed.world_size}))


# ----------------------------------------------------------------------------------------------- launcher

def launch(args: argparse.Namespace, out: str) -> dict:
    """The pfl run in a fresh process (``torchrun`` for several): times from the launch."""
    worker_args = [__file__, "--worker", "--out", out, "--data-root", args.data_root, "--rounds", str(args.rounds),
                   "--threads", str(args.threads)]
    if args.procs == 1:
        cmd = [sys.executable, *worker_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.procs),
               *worker_args]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.time() - t0
    if done.returncode != 0:
        raise SystemExit(f"pfl_cross_device: the pfl run failed:\n{done.stderr[-4000:]}")
    got = json.loads(Path(out).read_text())
    ends = got["rounds"]
    return {"processes": args.procs, "threads": args.threads, "world_size": got["world_size"],
            "round_s": statistics.median(b - a for a, b in zip(ends, ends[1:])),
            "rounds_s": [b - a for a, b in zip(ends, ends[1:])], "start_s": got["setup"] - t0,
            "first_round_s": ends[0] - t0, "evaluated_s": got["evaluated"] - t0, "process_wall_s": wall,
            "test_accuracy": got["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--procs", type=int, default=1, help="pfl worker processes (several run under torchrun)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per pfl worker process")
    ap.add_argument("--no-floor", action="store_true", help="skip the compute floor")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2")
    if args.worker:
        worker(args)
        return
    import pfl
    cfg = raysim_config(args.data_root, args.rounds)
    result: dict = {"pfl_version": pfl.__version__, "torch": torch.__version__, "cpus": os.cpu_count(),
                    "num_clients": cfg.num_clients, "clients_per_round": cfg.clients_per_round,
                    "batch_size": cfg.batch_size, "rounds": args.rounds}
    if not args.no_floor:
        result["floor"] = measure_floor(cfg, args.rounds - 1)
    with tempfile.TemporaryDirectory(prefix="pfl-cross-device-") as tmp:
        result["pfl"] = launch(args, os.path.join(tmp, "stamps.json"))
    if "floor" in result:
        fl = result["floor"]["floor_s"]
        run = result["pfl"]
        run.update(round_over_floor=run["round_s"] / fl, start_over_floor=run["start_s"] / fl)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
