"""The training function the Lightning TorchEstimator runs on every rank (upstream's
``horovod.spark.lightning.remote``).

Each rank reads its shard of the Parquet data (as the torch estimator does) and runs a real Lightning
``Trainer`` on it with ``horovod.lightning.HorovodStrategy``, so the module's own ``configure_optimizers``,
``training_step``, ``validation_step``, hooks and ``self.log`` work unchanged; the strategy keeps the learning
rates the module set (``scale_lr=False``), as this estimator always has. A batch is a dict of tensors by column
name (``batch["features"]``, ``batch["label"]``), as upstream's; features are float32, reshaped by
``input_shapes`` when given. Every rank runs the same number of steps per epoch. ``StoreCheckpoint`` records
the history (each epoch's mean training and validation loss and the values the module logged, averaged over
the ranks) and has rank 0 write Lightning's checkpoint to the store after every epoch. Rank 0 returns the
history and the trained weights.
"""
from __future__ import annotations

import io
import logging
import tempfile
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from horovod.spark.common.reader import batches, read_splits
from horovod.spark.common.spec import TrainingSpec

log = logging.getLogger(__name__)
# Lightning's warnings that do not apply here: the loaders give in-memory batches in this process, and
# lightning 2.6 uses a torch pytree name that torch 2.13 deprecates
_EXPECTED_WARNINGS = (".*does not have many workers.*", ".*`IterableDataset` has `__len__` defined.*",
                      ".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*")


@dataclass(kw_only=True)
class LightningTrainSpec(TrainingSpec):
    """What the ranks need to train: shipped to them (cloudpickled) by the backend."""

    model: Any
    input_shapes: Optional[List[Sequence[int]]]
    logger: Any = None
    log_every_n_steps: int = 50
    profiler: Any = None
    terminate_on_nan: bool = False
    trainer_args: Dict[str, Any] = field(default_factory=dict)


def lightning_package(module: Any) -> ModuleType:
    """The Lightning package whose ``LightningModule`` ``module`` is: ``lightning.pytorch`` or
    ``pytorch_lightning`` (a module is trained by its own package's Trainer)."""
    import importlib

    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            package = importlib.import_module(name)
        except ImportError:
            continue
        if isinstance(module, package.LightningModule):
            return package
    raise ValueError("model must be a lightning.LightningModule (or pytorch_lightning.LightningModule), not "
                     f"{type(module).__name__}; for a plain torch.nn.Module use "
                     "horovod.spark.torch.TorchEstimator")


def split_metrics(metrics: Dict[str, float]) -> Dict[str, Dict[str, float]]:
    """Logged metrics filed as training or validation ones: a name starting with ``val`` is a validation
    metric (``val_loss``, ``val/acc``, ``validation_accuracy``), any other a training one."""
    out: Dict[str, Dict[str, float]] = {"train": {}, "validation": {}}
    for name, value in metrics.items():
        out["validation" if name.lower().startswith("val") else "train"][name] = value
    return out


def average_over_ranks(per_rank: Sequence[Dict[str, float]]) -> Dict[str, float]:
    """Each name's mean over the ranks that have it."""
    names = sorted({name for values in per_rank for name in values})
    return {name: float(np.mean([values[name] for values in per_rank if name in values])) for name in names}


def step_loss(outputs: Any) -> Optional[float]:
    """The loss a ``training_step`` / ``validation_step`` returned (a tensor, or a dict with ``"loss"``)."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if outputs is None or not hasattr(outputs, "detach"):
        return None
    value = outputs.detach()
    return float(value) if value.numel() == 1 else None


def _shard_dataset(spec: LightningTrainSpec, arrays, batch_size: int, steps: int, shuffle: bool, rng):
    import torch

    class ShardBatches(torch.utils.data.IterableDataset):
        """``steps`` batches of this rank's shard per pass, as dicts of tensors by column."""

        def __iter__(self):
            for batch in batches(arrays, batch_size, steps, shuffle, rng):
                yield _batch_tensors(spec, batch)

        def __len__(self) -> int:
            return steps

    return torch.utils.data.DataLoader(ShardBatches(), batch_size=None)


def _batch_tensors(spec: LightningTrainSpec, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
    import torch

    out = {}
    for cols, shapes in ((spec.feature_cols, spec.input_shapes), (spec.label_cols, spec.label_shapes)):
        for i, col in enumerate(cols):
            tensor = torch.from_numpy(np.ascontiguousarray(batch[col])).float()
            out[col] = tensor.reshape(list(shapes[i])) if shapes else tensor
    if spec.sample_weight_col:
        weights = np.ascontiguousarray(batch[spec.sample_weight_col])
        out[spec.sample_weight_col] = torch.from_numpy(weights).float()
    return out


def _store_checkpoint_class(pl: ModuleType, spec: LightningTrainSpec, hvd: Any) -> type:
    class StoreCheckpoint(pl.callbacks.Checkpoint):
        """Records the history; rank 0 writes Lightning's checkpoint to the store after every epoch.

        A ``Checkpoint`` so that Lightning calls its ``on_train_epoch_end`` after the module's own (whose
        logged values it then sees), as it does for ModelCheckpoint."""

        def __init__(self) -> None:
            self.history: List[dict] = []
            self._losses: Dict[str, List[float]] = {"train": [], "validation": []}

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._losses = {"train": [], "validation": []}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self._record("train", outputs)

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                    dataloader_idx=0) -> None:
            if not trainer.sanity_checking:
                self._record("validation", outputs)

        def _record(self, split: str, outputs: Any) -> None:
            loss = step_loss(outputs)
            if loss is not None:
                self._losses[split].append(loss)

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            local = {"losses": {split: float(np.mean(values))
                                for split, values in self._losses.items() if values},
                     "logged": {name: float(value) for name, value in trainer.callback_metrics.items()
                                if getattr(value, "numel", lambda: 1)() == 1}}
            per_rank = hvd.allgather_object(local, name=f"lightning.metrics.{len(self.history)}")
            losses = average_over_ranks([values["losses"] for values in per_rank])
            logged = split_metrics(average_over_ranks([values["logged"] for values in per_rank]))
            record: Dict[str, Any] = {"epoch": trainer.current_epoch}
            for split in ("train", "validation"):
                values = {**({"loss": losses[split]} if split in losses else {}), **logged[split]}
                if values:
                    record[split] = values
            self.history.append(record)
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            if trainer.is_global_zero:
                _write_checkpoint(spec, checkpoint)
                if spec.verbose:
                    log.info("epoch %d/%d: %s", trainer.current_epoch + 1, spec.epochs, record)

    return StoreCheckpoint


def _write_checkpoint(spec: LightningTrainSpec, checkpoint: dict) -> None:
    import torch

    path = spec.store.get_checkpoint_path(spec.run_id)
    if path is None:
        return
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    spec.store.write(path, buffer.getvalue())


def _trainer(pl: ModuleType, spec: LightningTrainSpec, strategy: Any, callbacks: list, root: str) -> Any:
    """Every rank's Trainer: the loaders give each epoch's steps; Lightning's own checkpointing is the
    store's."""
    args = dict(max_epochs=spec.epochs, accelerator="cpu", devices=1, strategy=strategy, callbacks=callbacks,
                logger=spec.logger if spec.logger is not None else False, default_root_dir=root,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                log_every_n_steps=spec.log_every_n_steps, profiler=spec.profiler,
                use_distributed_sampler=False)
    if spec.terminate_on_nan:
        args["detect_anomaly"] = True
    args.update(spec.trainer_args or {})
    return pl.Trainer(**args)


def train(spec: LightningTrainSpec) -> Optional[dict]:
    """Train on this rank with a Lightning Trainer; rank 0 returns ``{"history": [...], "state_dict":
    ...}``."""
    import torch

    import horovod.torch as hvd
    from horovod.lightning.strategy import strategy_class

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    pl = lightning_package(spec.model)
    pl.utilities.rank_zero.rank_zero_only.rank = rank  # Lightning's rank-zero-only messages: rank 0's only
    if not spec.verbose:
        logging.getLogger(pl.__name__).setLevel(logging.WARNING)  # no "GPU available: ..." and tips
    if spec.random_seed is not None:
        torch.manual_seed(spec.random_seed)
    rng = np.random.default_rng(None if spec.random_seed is None else spec.random_seed + rank)
    train_arrays, val_arrays, train_steps, val_steps = read_splits(spec, rank, size)
    train_loader = _shard_dataset(spec, train_arrays, spec.batch_size, train_steps, spec.shuffle, rng)
    val_loader = (_shard_dataset(spec, val_arrays, spec.val_batch_size, val_steps, False, rng)
                  if val_arrays is not None else None)
    history = _store_checkpoint_class(pl, spec, hvd)()
    strategy = strategy_class(pl)(compression=spec.compression,
                                  backward_passes_per_step=spec.backward_passes_per_step, scale_lr=False)
    with tempfile.TemporaryDirectory(prefix="hvd-lightning-") as root, warnings.catch_warnings():
        for message in _EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        trainer = _trainer(pl, spec, strategy, [*spec.callbacks, history], root)
        trainer.fit(spec.model, train_dataloaders=train_loader,
                    **({"val_dataloaders": val_loader} if val_loader is not None else {}))
    if rank != 0:
        return None
    return {"history": history.history,
            "state_dict": {k: v.detach().cpu() for k, v in spec.model.state_dict().items()}}
