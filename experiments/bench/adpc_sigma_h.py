"""How much ADPC's histogram release raises the calibrated DP-SGD σ, per σ_h (and how long calibration takes).

For a preset (default: the CIFAR-10 paper preset, T = 100 rounds, ε = 8) this builds the real
partition, calibrates every client's σ without the histogram release (``feddimdp.adpc=false``) and
with it for each σ_h of a grid, and prints the largest relative increase over the clients and the
seconds each calibration took. The default ``adpc.histogram_noise_multiplier`` is the smallest grid
value with ≤ 3 % (docs/methods.md, "Default σ_h").

    python experiments/bench/adpc_sigma_h.py --data-root DATA_ROOT [--config experiments/paper/cifar10.yaml]
    python experiments/bench/adpc_sigma_h.py --config experiments/quickstart.yaml       # offline
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from raysim.config import ConfigError, apply_overrides, cli_overrides, config_from_dict, read_yaml
from raysim.data import load_dataset
from raysim.privacy.plan import plan_noise
from raysim.run_data import make_partition
from raysim.run_plan import plan_run
from raysim.training import sample_rate, steps_per_epoch

GRID = (5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100)


def sigmas(cfg) -> np.ndarray:
    plan = plan_run(cfg)
    cfg, spec = plan.cfg, plan.spec
    train = load_dataset(cfg.data.name, "train", cfg.data.root, cache_dir=cfg.data.cache_dir)
    clients = make_partition(cfg, train)
    n = np.array([len(c.train_indices) for c in clients])
    q = np.array([sample_rate(int(k), cfg.batch_size) for k in n])
    steps = np.array([steps_per_epoch(int(k), cfg.batch_size) * cfg.local_epochs for k in n])
    return plan_noise(spec, cfg, plan.clipping, q, steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/paper/cifar10.yaml")
    ap.add_argument("--data-root", default=None, help="folder holding cifar10/, svhn/, stl10/ (sets data.root)")
    ap.add_argument("--grid", type=float, nargs="+", default=list(GRID), help="the σ_h values to try")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    values = apply_overrides(read_yaml(args.config), cli_overrides(args.set, data_root=args.data_root))
    values["method"] = "feddimdp"
    base = config_from_dict(apply_overrides(values, [("feddimdp.adpc", False)]))
    t0 = time.perf_counter()
    ref = sigmas(base)
    rows = [{"histogram_noise_multiplier": None, "max_sigma": float(ref.max()), "max_increase": 0.0,
             "seconds": time.perf_counter() - t0}]
    print(f"without the histogram: σ_i in [{ref.min():.4f}, {ref.max():.4f}] ({rows[0]['seconds']:.1f} s)", file=sys.stderr)
    for sigma_h in args.grid:
        t0 = time.perf_counter()
        cfg = config_from_dict(apply_overrides(values, [("adpc.histogram_noise_multiplier", sigma_h)]))
        try:
            got = sigmas(cfg)
        except ConfigError as exc:   # the release alone spends the budget
            print(f"σ_h = {sigma_h:>4}: {exc}", file=sys.stderr)
            continue
        inc = float(np.max(got / ref - 1.0))
        rows.append({"histogram_noise_multiplier": sigma_h, "max_sigma": float(got.max()), "max_increase": inc,
                     "seconds": time.perf_counter() - t0})
        print(f"σ_h = {sigma_h:>4}: σ rises by at most {100 * inc:.2f} % ({rows[-1]['seconds']:.1f} s)", file=sys.stderr)
    ok = [r["histogram_noise_multiplier"] for r in rows[1:] if r["max_increase"] <= 0.03]
    print(json.dumps({"rows": rows, "smallest_within_3_percent": min(ok) if ok else None}) if args.json else
          f"smallest σ_h in {args.grid} with ≤ 3 % increase: {min(ok) if ok else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
