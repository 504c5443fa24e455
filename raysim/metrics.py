"""Classification metrics computed the same way on the server and the clients."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> float:
    """Macro-F1 over the classes present in ``y_true`` or ``y_pred`` (scikit-learn's convention)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if y_true.size == 0:
        return 0.0
    cm = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    tp = np.diag(cm).astype(np.float64)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    present = (support + predicted) > 0
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1[present].mean())


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    f1: float
    loss: float


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, batch_size: int = 1000) -> Evaluation:
    """Accuracy, macro-F1 and mean cross-entropy of ``model`` on (x, y) (CPU tensors out; no autograd graph)."""
    return summarize(*eval_batches(model, x, y, batch_size), y, num_classes)


#: Rows per forward pass of an evaluation on the CPU. A batch of ``eval_batch_size`` rows goes through the
#: model a chunk at a time: each row's logits are the same bits (every layer computes a row on its own), and
#: the paper CNN's largest activation is 16 MB for a chunk where a batch of 1,000 CIFAR-10 images makes
#: one of 128 MB (the final evaluation 4× faster on two actors, docs/performance.md).
EVAL_CHUNK = 128


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """Image batches go through the model channels-last (NHWC): oneDNN's convolutions run natively in
    that layout, so the paper CNN's forward pass takes about 45 % less time than in NCHW, and the
    forward and output-gradient backward passes of a training step about a quarter less (on CPU;
    docs/performance.md). The math is the same; other inputs pass through."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


@torch.no_grad()
def eval_batches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[list[float], torch.Tensor]:
    """The summed cross-entropy of each batch of ``batch_size`` rows of (x, y), in order, and the
    predictions (CPU). The batches of a split of (x, y) at multiples of ``batch_size`` are the same
    batches, so evaluating the parts in several processes and :func:`summarize`-ing them in order
    gives the same bits as one :func:`evaluate` at the same thread count. On the CPU the rows go through
    the model :data:`EVAL_CHUNK` at a time, channels-last (:func:`channels_last`; as given for a model
    that cannot take that layout, e.g. one that ``.view()``s its feature maps)."""
    model.eval()
    losses, preds = [], []
    chunk = EVAL_CHUNK if x.device.type == "cpu" else batch_size
    nhwc = True   # until the model refuses that layout
    for start in range(0, len(y), batch_size):
        stop = min(start + batch_size, len(y))
        parts = []
        for lo in range(start, stop, chunk):
            rows = x[lo:min(lo + chunk, stop)]
            if nhwc and (shaped := channels_last(rows)) is not rows:
                try:
                    parts.append(model(shaped))
                    continue
                except RuntimeError:
                    nhwc = False
            parts.append(model(rows))
        logits = torch.cat(parts) if len(parts) > 1 else parts[0]
        losses.append(float(F.cross_entropy(logits, y[start:stop].to(logits.device), reduction="sum")))
        preds.append(logits.argmax(dim=1).cpu())
    model.train()
    return losses, torch.cat(preds) if preds else torch.zeros(0, dtype=torch.int64)


def summarize(losses: list[float], pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> Evaluation:
    """The metrics of :func:`eval_batches`' output for the labels ``y`` (the batches' losses summed in order)."""
    if not losses:
        return Evaluation(0.0, 0.0, float("nan"))
    loss_sum = 0.0
    for loss in losses:   # one addition after another, as the batches come (not sum(): compensated on Python ≥ 3.12)
        loss_sum += loss
    pred, truth = pred.numpy(), y.cpu().numpy()
    return Evaluation(float((pred == truth).mean()), macro_f1(truth, pred, num_classes), loss_sum / len(y))
