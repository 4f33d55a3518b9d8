"""The fields every framework's training spec shares (what the ranks need to read their data and train).

Each framework's spec (``TorchTrainSpec``, ``LightningTrainSpec``) is a keyword-only dataclass that extends
this one with its own fields; the estimator fills these from its params and the prepared data
(``HorovodEstimator._data_spec_kwargs``), and ``reader.read_splits`` reads a rank's shards with them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence


@dataclass(kw_only=True)
class TrainingSpec:
    """The columns, the prepared data in the store, the epochs and batches, and the shared training params."""

    feature_cols: List[str]
    label_cols: List[str]
    sample_weight_col: Optional[str]
    label_shapes: Optional[List[Sequence[int]]]
    store: Any
    run_id: str
    dataset_idx: str
    train_rows: int
    val_rows: int
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps_per_epoch: Optional[int]
    validation_steps_per_epoch: Optional[int]
    shuffle: bool
    random_seed: Optional[int]
    compression: Any
    backward_passes_per_step: int
    transformation_fn: Optional[Callable]
    callbacks: List[Any] = field(default_factory=list)
    verbose: int = 1
