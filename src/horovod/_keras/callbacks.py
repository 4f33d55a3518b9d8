"""Keras callbacks for distributed training (upstream's ``horovod/_keras/callbacks.py``).
``horovod.keras.callbacks`` and ``horovod.tensorflow.keras.callbacks`` export these.

Each one is a Keras 3 callback that tf_keras's ``model.fit`` accepts as well (``_TfKerasProtocol``), and does its
work on the model it is given: a Keras 3 model (any backend) through ``horovod._keras.values``, a tf_keras (Keras 2)
model through ``horovod._keras.keras2.state``. So one program may train both kinds with the same callbacks.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Union

import keras
import numpy as np

from horovod._keras import values
from horovod._keras.flavor import is_tf_keras
from horovod.core import basics, ops
from horovod.core.process_sets import global_process_set

_TRAIN_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _overrides(callback: Any, names: Iterable[str]) -> bool:
    return any(getattr(type(callback), n) is not getattr(keras.callbacks.Callback, n) for n in names)


class _TfKerasProtocol:
    """What tf_keras's ``CallbackList`` asks of a callback besides the ``on_*`` hooks: which batch hooks it
    implements (tf_keras skips the others) and whether ``logs`` may hold tensors (no: it gets numbers)."""

    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return _overrides(self, _TRAIN_BATCH_HOOKS)

    def _implements_test_batch_hooks(self) -> bool:
        return _overrides(self, ("on_test_batch_begin", "on_test_batch_end"))

    def _implements_predict_batch_hooks(self) -> bool:
        return _overrides(self, ("on_predict_batch_begin", "on_predict_batch_end"))


class _Callback(_TfKerasProtocol, keras.callbacks.Callback):
    """The base of Horovod's callbacks (see the module docstring)."""


def _local_variable_list(local_variables: Any) -> list:
    """``local_variables`` as a list: upstream accepts one variable as well as a collection of them."""
    if local_variables is None:
        return []
    if hasattr(local_variables, "assign"):
        return [local_variables]
    return list(local_variables)


def _broadcast_model(model: Any, root_rank: int, local_variables: Iterable[Any], include_optimizer: bool) -> None:
    if is_tf_keras(model):
        from horovod._keras.keras2 import state

        state.broadcast_model(model, root_rank, local_variables, include_optimizer=include_optimizer)
    else:
        values.broadcast_model(model, root_rank, local_variables, include_optimizer=include_optimizer)


class BroadcastGlobalVariablesCallback(_Callback):
    """Make every rank start from ``root_rank``'s model and optimizer state.

    The model's variables are broadcast when training begins (so the first step already starts from the same
    weights) and, as upstream, everything including the optimizer's variables after the first batch: only then
    does every rank have them (a rank that loaded a checkpoint has them before, the others after their first
    step). ``local_variables`` (one variable or a collection; or ``register_local_var``) keep this rank's values.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Optional[Iterable[Any]] = None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.local_variables = _local_variable_list(local_variables)
        self.broadcast_done = False

    def register_local_var(self, var: Any) -> None:
        """Keep ``var`` out of the broadcast."""
        self.local_variables.append(var)

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            _broadcast_model(self.model, self.root_rank, self.local_variables, include_optimizer=False)

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        _broadcast_model(self.model, self.root_rank, self.local_variables, include_optimizer=True)
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """At the end of every epoch, replace each metric in ``logs`` by its average over all ranks (one grouped
    allreduce, in sorted-name order), so that rank 0's report, checkpoints and early stopping see global values."""

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device

    def _average_metrics_in_place(self, logs) -> None:
        if not logs or basics.size() == 1:
            return
        names = sorted(logs)
        arrays = [np.asarray(keras.ops.convert_to_numpy(logs[k]), dtype=np.float64).reshape(-1) for k in names]
        with ops.blocking():
            outs = ops.grouped_allreduce_async(arrays, None, "MetricAverageCallback." + ".".join(names),
                                               process_set=global_process_set).wait()
        for k, arr, out in zip(names, arrays, outs):
            logs[k] = float(out[0]) if arr.size == 1 else out

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _get_lr(optimizer: Any) -> float:
    if is_tf_keras(optimizer):
        from horovod._keras.keras2 import state

        return state.get_lr(optimizer)
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _set_lr(optimizer: Any, value: float) -> None:
    if is_tf_keras(optimizer):
        from horovod._keras.keras2 import state

        state.set_lr(optimizer, value)
    else:
        optimizer.learning_rate = value


def _momentum_slots(optimizer: Any) -> list:
    """The momentum slots of an optimizer whose momentum accumulates learning-rate-scaled steps: SGD's
    ``momentums`` and RMSprop's ``_momentums`` (Keras 3 and tf_keras's v2 optimizers alike)."""
    if not getattr(optimizer, "momentum", 0):
        return []
    return list(getattr(optimizer, "momentums", None) or getattr(optimizer, "_momentums", None) or [])


def _scale_momentum_slots(optimizer: Any, ratio: float) -> None:
    """Momentum correction (Goyal et al.) for optimizers whose ``momentum`` is a Python float, frozen once the
    train step is traced: scaling the momentum by new_lr / old_lr for one step equals scaling the momentum slots
    once by that ratio. This works on every backend and inside an already-traced train step."""
    if ratio == 1.0:
        return
    for slot in _momentum_slots(optimizer):
        slot.assign(slot * ratio)


class LearningRateScheduleCallback(_Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in [``start_epoch``, ``end_epoch``).

    A constant ``multiplier`` is exponential decay, as in upstream's code: ``initial_lr * multiplier ** (epoch -
    start_epoch)`` from each epoch's first batch (staircase). (Upstream's docstring says ``initial_lr *
    multiplier``; programs got the power, so that is what is kept.) A callable is
    ``f(epoch)``; without ``staircase`` it is called every batch with a fractional epoch. ``momentum_correction``
    scales the momentum by new_lr / old_lr for the step of each change: a tf_keras legacy optimizer's
    ``momentum`` hyperparameter for that batch (as upstream), the momentum slots otherwise. ``logs["lr"]`` gets
    the rate at the end of each epoch.
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]], start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.staircase = True
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                         f"parameter to the {type(self).__name__}().")

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        values.sync_backend_state(self.model)
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(optimizer, new_lr)
        if not self.momentum_correction or old_lr <= 0:
            return
        momentum = None
        if is_tf_keras(optimizer):
            from horovod._keras.keras2 import state

            momentum = state.momentum_hyper(optimizer)
        if momentum is None:
            _scale_momentum_slots(optimizer, new_lr / old_lr)
        elif momentum:
            state.set_momentum_hyper(optimizer, momentum * new_lr / old_lr)
            self.restore_momentum = momentum

    def _restore_momentum_if_needed(self) -> None:
        """A corrected momentum hyperparameter applies to one batch; the next hook puts it back."""
        if self.restore_momentum is not None:
            from horovod._keras.keras2 import state

            state.set_momentum_hyper(self.model.optimizer, self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        self._restore_momentum_if_needed()
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None
                                                     and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        self._restore_momentum_if_needed()
        if logs is not None:
            values.sync_backend_state(self.model)
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.):
    ``lr = initial_lr / size * (e * (size - 1) / warmup_epochs + 1)`` with e = epoch + (batch + 1) /
    steps_per_epoch, set every batch."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0):
        def multiplier(epoch: float) -> float:
            # Shifted by one batch so that the value at the end of each epoch is a round number.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            values.sync_backend_state(self.model)
            # verbose asks for a console message, as Keras' own callbacks print theirs.
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.", flush=True)


class BestModelCheckpoint(_TfKerasProtocol, keras.callbacks.ModelCheckpoint):
    """A ``ModelCheckpoint`` that keeps only the best model (``save_best_only=True``).

    ``filepath`` may be given later (upstream's estimators set it) by assigning ``callback.filepath`` before
    training; for a Keras 3 model it must end in ``.keras`` (or ``.weights.h5`` with ``save_weights_only``), a
    tf_keras model saves in whatever format its ``save`` gives that path (``.h5``, ``.keras``, a SavedModel
    directory). Save it on rank 0 only.
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: Union[str, int] = "epoch", filepath: Optional[str] = None):
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no filepath: set `callback.filepath` (ending in .keras, or "
                             ".weights.h5 with save_weights_only) before training.")
        super().on_train_begin(logs)
