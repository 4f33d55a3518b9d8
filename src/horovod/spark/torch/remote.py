"""The training function TorchEstimator runs on every rank (upstream's ``horovod.spark.torch.remote``).

Each rank reads its shard of the Parquet data, trains a copy of the model with ``hvd.DistributedOptimizer``
from rank 0's broadcast parameters and optimizer state, averages each epoch's loss and metrics over the ranks,
and rank 0 writes a checkpoint to the store after every epoch. Rank 0 returns the history and the trained
weights.
"""
from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from horovod.spark.common.reader import batches, read_splits
from horovod.spark.common.spec import TrainingSpec

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class TorchTrainSpec(TrainingSpec):
    """What the ranks need to train: shipped to them (cloudpickled) by the backend."""

    model: Any
    optimizer_cls: type
    optimizer_state: dict
    losses: List[Callable]
    loss_weights: Optional[List[float]]
    metrics: List[Callable]
    input_shapes: Optional[List[Sequence[int]]]
    train_minibatch_fn: Optional[Callable]


def _tensors(batch: Dict[str, np.ndarray], cols: Sequence[str],
             shapes: Optional[List[Sequence[int]]]) -> list:
    import torch

    out = []
    for i, col in enumerate(cols):
        tensor = torch.from_numpy(np.ascontiguousarray(batch[col])).float()
        if shapes:
            tensor = tensor.reshape(list(shapes[i]))  # upstream's shapes include the batch dimension (-1)
        out.append(tensor)
    return out


def _as_list(outputs: Any) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _loss(spec: TorchTrainSpec, outputs: list, labels: list, weights: Any):
    total = 0
    for i, (output, label) in enumerate(zip(outputs, labels)):
        loss_fn = spec.losses[i] if len(spec.losses) > 1 else spec.losses[0]
        value = loss_fn(output, label)
        if weights is not None:
            if value.dim() == 0:
                raise ValueError("sample_weight_col needs a loss that returns one value per row (e.g. "
                                 "reduction='none'), so that each row's loss can be weighted; this loss "
                                 "returned a single number")
            value = (value.reshape(len(weights), -1).mean(1) * weights).mean()
        total = total + (spec.loss_weights[i] if spec.loss_weights else 1.0) * value
    return total


def _metric_values(spec: TorchTrainSpec, outputs: list, labels: list) -> Dict[str, float]:
    values = {}
    for metric in spec.metrics:
        name = getattr(metric, "__name__", type(metric).__name__)
        for output, label, label_col in zip(outputs, labels, spec.label_cols):
            key = name if len(spec.label_cols) == 1 else f"{label_col}_{name}"
            values[key] = float(metric(output.detach(), label))
    return values


def _average(hvd, sums: Dict[str, float], steps: int, prefix: str) -> Dict[str, float]:
    """Per-step means over this rank's steps, then averaged over the ranks (every rank ran ``steps``)."""
    import torch

    names = sorted(sums)
    local = torch.tensor([sums[name] / max(steps, 1) for name in names], dtype=torch.float64)
    averaged = hvd.allreduce(local, op=hvd.Average, name=f"spark.metrics.{prefix}")
    return {name: float(value) for name, value in zip(names, averaged)}


def _run_epoch(spec, hvd, model, optimizer, arrays, batch_size, steps, train, rng,
               prefix) -> Dict[str, float]:
    import torch

    model.train(train)
    sums: Dict[str, float] = {}
    for step, batch in enumerate(batches(arrays, batch_size, steps, spec.shuffle and train, rng)):
        inputs = _tensors(batch, spec.feature_cols, spec.input_shapes)
        labels = _tensors(batch, spec.label_cols, spec.label_shapes)
        weights = torch.from_numpy(batch[spec.sample_weight_col]).float() if spec.sample_weight_col else None
        with torch.set_grad_enabled(train):
            if train and spec.train_minibatch_fn is not None:
                outputs, loss = spec.train_minibatch_fn(model, optimizer, _as_list, _loss_fn(spec), inputs,
                                                        labels, weights)
                outputs = _as_list(outputs)
            else:
                outputs = _as_list(model(*inputs))
                loss = _loss(spec, outputs, labels, weights)
                if train:
                    loss.backward()
                    if (step + 1) % spec.backward_passes_per_step == 0:
                        optimizer.step()
                        optimizer.zero_grad()
        for name, value in {"loss": float(loss.detach()), **_metric_values(spec, outputs, labels)}.items():
            sums[name] = sums.get(name, 0.0) + value
    return _average(hvd, sums, steps, prefix)


def _loss_fn(spec: TorchTrainSpec) -> Callable:
    def loss_fn(outputs, labels, weights=None):
        return _loss(spec, _as_list(outputs), labels, weights)

    return loss_fn


def _checkpoint(spec: TorchTrainSpec, model, optimizer, epoch: int) -> None:
    import torch

    path = spec.store.get_checkpoint_path(spec.run_id)
    if path is None:
        return
    buffer = io.BytesIO()
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    spec.store.write(path, buffer.getvalue())


def _callbacks(spec: TorchTrainSpec, hook: str, *args: Any) -> None:
    for callback in spec.callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


def train(spec: TorchTrainSpec) -> Optional[dict]:
    """Train on this rank; rank 0 returns ``{"history": [...], "state_dict": ..., "optimizer_state":
    ...}``."""
    import torch

    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if spec.random_seed is not None:
        torch.manual_seed(spec.random_seed)
    rng = np.random.default_rng(None if spec.random_seed is None else spec.random_seed + rank)
    model = spec.model
    optimizer = spec.optimizer_cls(model.parameters(), lr=1.0)
    optimizer.load_state_dict(spec.optimizer_state)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=spec.compression or hvd.Compression.none,
                                         backward_passes_per_step=spec.backward_passes_per_step)
    train_arrays, val_arrays, train_steps, val_steps = read_splits(spec, rank, size)
    history: List[dict] = []
    _callbacks(spec, "on_train_begin")
    for epoch in range(spec.epochs):
        record = {"epoch": epoch,
                  "train": _run_epoch(spec, hvd, model, optimizer, train_arrays, spec.batch_size, train_steps,
                                      True, rng, f"train.{epoch}")}
        if val_arrays is not None:
            record["validation"] = _run_epoch(spec, hvd, model, optimizer, val_arrays, spec.val_batch_size,
                                              val_steps, False, rng, f"val.{epoch}")
        history.append(record)
        if rank == 0:
            _checkpoint(spec, model, optimizer, epoch)
            if spec.verbose:
                log.info("epoch %d/%d: %s", epoch + 1, spec.epochs, record)
        _callbacks(spec, "on_epoch_end", epoch, record)
    _callbacks(spec, "on_train_end")
    if rank != 0:
        return None
    return {"history": history, "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer_state": optimizer.state_dict()}
