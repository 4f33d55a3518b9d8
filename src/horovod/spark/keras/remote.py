"""The training function KerasEstimator runs on every rank (upstream's ``horovod.spark.keras.remote``).

Each rank loads the model from its ``.keras`` bytes, compiles it with ``hvd.DistributedOptimizer``, reads its
shard of the Parquet data into a repeating ``tf.data`` pipeline, and runs ``model.fit`` with the same number
of steps per epoch on every rank, starting from rank 0's broadcast weights and averaging the epoch metrics
over the ranks. Rank 0 saves a checkpoint to the store after every epoch, and returns the history and the
weights.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from horovod.spark.common.reader import read_shard, steps_per_epoch
from horovod.spark.common.spec import TrainingSpec

MODEL_FILE = "model.keras"


def model_to_bytes(model: Any) -> bytes:
    """A Keras model in the ``.keras`` format, as bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data: bytes, custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    """The Keras model ``model_to_bytes`` saved (uncompiled)."""
    import keras

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=False)


@dataclass(kw_only=True)
class KerasTrainSpec(TrainingSpec):
    """What the ranks need to train: shipped to them (cloudpickled) by the backend."""

    model_bytes: bytes
    optimizer: Any  # a Keras optimizer's serialized config, or a name
    loss: Any
    loss_weights: Any
    metrics: List[Any]
    custom_objects: Dict[str, Any]


def _model_inputs(model: Any, arrays: Dict[str, np.ndarray], cols: List[str]) -> Any:
    """Feature arrays as float32, reshaped to the model's input shapes where their sizes agree."""
    inputs = []
    shapes = [tuple(tensor.shape[1:]) for tensor in getattr(model, "inputs", None) or []]
    for i, col in enumerate(cols):
        values = arrays[col].astype(np.float32, copy=False)
        if i < len(shapes) and None not in shapes[i] and values[0].size == int(np.prod(shapes[i])):
            values = values.reshape((-1, *shapes[i]))
        inputs.append(values)
    return inputs[0] if len(inputs) == 1 else tuple(inputs)


def _labels(spec: KerasTrainSpec, arrays: Dict[str, np.ndarray]) -> Any:
    labels = []
    for i, col in enumerate(spec.label_cols):
        values = arrays[col]
        if spec.label_shapes:
            values = values.reshape([-1, *spec.label_shapes[i]])
        labels.append(values)
    return labels[0] if len(labels) == 1 else tuple(labels)


def _dataset(spec: KerasTrainSpec, model: Any, arrays: Dict[str, np.ndarray], batch_size: int, shuffle: bool):
    import tensorflow as tf

    parts = [_model_inputs(model, arrays, spec.feature_cols), _labels(spec, arrays)]
    if spec.sample_weight_col:
        parts.append(arrays[spec.sample_weight_col].astype(np.float32))
    dataset = tf.data.Dataset.from_tensor_slices(tuple(parts))
    if shuffle:
        dataset = dataset.shuffle(len(arrays[spec.label_cols[0]]), seed=spec.random_seed,
                                  reshuffle_each_iteration=True)
    return dataset.repeat().batch(batch_size)


def _checkpoint_callback(spec: KerasTrainSpec):
    import keras

    class CheckpointToStore(keras.callbacks.Callback):
        """Rank 0: the model's weights to the store's checkpoint path after every epoch."""

        def on_epoch_end(self, epoch, logs=None):
            path = spec.store.get_checkpoint_path(spec.run_id)
            if path is not None:
                spec.store.write(path, model_to_bytes(self.model))

    return CheckpointToStore()


def train(spec: KerasTrainSpec) -> Optional[dict]:
    """Train on this rank; rank 0 returns ``{"history": {...}, "weights": [...]}``."""
    import keras

    import horovod.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if spec.random_seed is not None:
        keras.utils.set_random_seed(spec.random_seed)
    model = model_from_bytes(spec.model_bytes, spec.custom_objects)
    optimizer = (keras.optimizers.deserialize(spec.optimizer, custom_objects=spec.custom_objects)
                 if isinstance(spec.optimizer, dict) else keras.optimizers.get(spec.optimizer))
    optimizer = hvd.DistributedOptimizer(optimizer, compression=spec.compression or hvd.Compression.none,
                                         backward_passes_per_step=spec.backward_passes_per_step)
    model.compile(optimizer=optimizer, loss=spec.loss, loss_weights=spec.loss_weights, metrics=spec.metrics)
    cols = list(dict.fromkeys([*spec.feature_cols, *spec.label_cols,
                               *([spec.sample_weight_col] if spec.sample_weight_col else [])]))
    store, idx = spec.store, spec.dataset_idx
    train_arrays = read_shard(store, store.get_train_data_path(idx), rank, size, cols, spec.transformation_fn)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 *spec.callbacks]
    if rank == 0:
        callbacks.append(_checkpoint_callback(spec))
    fit_args: Dict[str, Any] = {}
    if spec.val_rows:
        val_arrays = read_shard(store, store.get_val_data_path(idx), rank, size, cols, spec.transformation_fn)
        fit_args = {"validation_data": _dataset(spec, model, val_arrays, spec.val_batch_size, False),
                    "validation_steps": steps_per_epoch(spec.val_rows, spec.val_batch_size, size,
                                                        spec.validation_steps_per_epoch)}
    history = model.fit(_dataset(spec, model, train_arrays, spec.batch_size, spec.shuffle),
                        steps_per_epoch=steps_per_epoch(spec.train_rows, spec.batch_size, size,
                                                        spec.train_steps_per_epoch),
                        epochs=spec.epochs, callbacks=callbacks, verbose=spec.verbose if rank == 0 else 0,
                        shuffle=False,  # the tf.data pipeline shuffles
                        **fit_args)
    if rank != 0:
        return None
    return {"history": {name: [float(v) for v in values] for name, values in history.history.items()},
            "weights": [np.asarray(w) for w in model.get_weights()]}
