"""``ZeroRedundancyOptimizer`` for Keras 3 on TensorFlow: ZeRO stage 1. Each rank of a process set keeps the
optimizer state (Adam's m and v, ...) of only the variables it owns, about 1/n of it.

As ``DistributedOptimizer`` (``horovod._keras.optimizer``) it is a dynamic subclass of the user's optimizer
class, re-created from its config, hooking ``build`` and ``apply``:

- ``build(variables)`` assigns every variable an owner (``horovod.common.zero_layout``: whole variables, balanced
  by size; one flat buffer per dtype, laid out by owner) and builds the wrapped class over this rank's
  variables only, so its slot variables exist for those only.
- ``apply(grads, variables)`` packs the gradients into the flat buffers and reduce-scatters them (one grouped
  reducescatter, averaged over the set), so this rank receives the averaged gradients of its own variables; the
  wrapped class updates those (clipping per variable, weight decay, constraints, learning-rate schedules as
  usual); then one grouped allgather of the owners' updated values hands every rank every variable.
  ``iterations`` advances by one per ``apply`` on every rank, also on a rank that owns nothing.

Eagerly and inside ``tf.function`` (``model.fit``). At one rank, and on a rank outside ``process_set``, it is the
wrapped optimizer alone. See docs/zero.md ("TensorFlow / Keras").
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np

from horovod._keras import backend_ops
from horovod.common.types import Average
from horovod.common.zero_layout import BucketLayout, Param, layout, plan
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set

logger = logging.getLogger(__name__)


@dataclass
class _Settings:
    name: str
    process_set: ProcessSet
    backward_passes_per_step: int
    average_aggregated_gradients: bool


class _Shards:
    """Owners of the variables an optimizer was built with, for the process set's size, and the TensorFlow ops
    that pack gradients into flat buffers, exchange them and hand the updated variables back."""

    def __init__(self, variables: List[Any], size: int, rank: int) -> None:
        self.size, self.rank = size, rank
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.dtypes = [keras.backend.standardize_dtype(v.dtype) for v in variables]
        self.numels = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        described = [Param(n, np.dtype(d).itemsize, d) for n, d in zip(self.numels, self.dtypes)]
        made = plan(described, size, sys.maxsize)                # one bucket per dtype: one collective each
        self.owners: Dict[int, int] = made.owners
        self.buckets: List[Tuple[str, BucketLayout]] = [
            (described[m[0]].kind, layout(m, made.owners, self.numels, size)) for m in made.buckets]

    def mine(self, index: int) -> bool:
        return self.owners[index] == self.rank

    def reduce(self, grads: List[Any], name: str, process_set: ProcessSet) -> Dict[int, Any]:
        """Averaged gradients of this rank's variables, by index, from one grouped reducescatter (a None
        gradient travels as zeros)."""
        import tensorflow as tf

        from horovod.tensorflow.mpi_ops import _grouped_reducescatter

        buffers = []
        for dtype, lay in self.buckets:
            parts = []
            for members, used in zip(lay.per_rank, lay.used):
                for i in members:
                    g = grads[i]
                    parts.append(tf.zeros([self.numels[i]], dtype) if g is None
                                 else tf.reshape(tf.cast(backend_ops.to_dense(g), dtype), [-1]))
                if lay.segment > used:
                    parts.append(tf.zeros([lay.segment - used], dtype))
            buffers.append(tf.concat(parts, 0))
        segments = _grouped_reducescatter(buffers, name=f"{name}.grads", op=Average, ignore_name_scope=True,
                                          process_set=process_set)
        return {i: tf.reshape(segment[lay.offsets[i]:lay.offsets[i] + self.numels[i]], self.shapes[i])
                for (_, lay), segment in zip(self.buckets, segments) for i in lay.per_rank[self.rank]}

    def gather(self, variables: List[Any], name: str, process_set: ProcessSet) -> None:
        """Assign every other rank's variables from one grouped allgather of the owners' current values."""
        import tensorflow as tf

        from horovod.tensorflow.mpi_ops import grouped_allgather

        sends = []
        for dtype, lay in self.buckets:
            parts = [tf.reshape(tf.convert_to_tensor(variables[i].value), [-1]) for i in lay.per_rank[self.rank]]
            if lay.segment > lay.used[self.rank]:
                parts.append(tf.zeros([lay.segment - lay.used[self.rank]], dtype))
            sends.append(tf.concat(parts, 0))
        gathered = grouped_allgather(sends, name=f"{name}.variables", ignore_name_scope=True,
                                     process_set=process_set)
        for (_, lay), flat in zip(self.buckets, gathered):
            for r, members in enumerate(lay.per_rank):
                if r == self.rank:
                    continue
                for i in members:
                    start = lay.padded_start(i, r)
                    variables[i].assign(tf.reshape(flat[start:start + self.numels[i]], self.shapes[i]))


def _check_supported(optimizer: Any) -> None:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"ZeroRedundancyOptimizer expects a Keras 3 optimizer (keras.optimizers.Optimizer), got "
                         f"{type(optimizer).__name__}; tf_keras (Keras 2) optimizers are not supported: use "
                         "hvd.DistributedOptimizer for them.")
    if getattr(type(optimizer), "_hvd_settings", None) is not None or hasattr(type(optimizer), "_hvd_zero"):
        raise ValueError("This optimizer is already wrapped by Horovod; wrap the original Keras optimizer once.")
    if backend_ops.backend() != "tensorflow":
        raise NotImplementedError(f"ZeroRedundancyOptimizer for Keras supports the tensorflow Keras backend only, "
                                  f"not {backend_ops.backend()!r}: set KERAS_BACKEND=tensorflow, or use "
                                  "hvd.DistributedOptimizer (or horovod.torch's / horovod.jax's "
                                  "ZeroRedundancyOptimizer outside Keras).")
    if optimizer.global_clipnorm is not None:
        raise ValueError("ZeroRedundancyOptimizer cannot clip by the global norm (global_clipnorm): each rank "
                         "updates only its own variables and would see a partial norm. Use clipnorm or "
                         "clipvalue (per variable), or hvd.DistributedOptimizer.")
    if optimizer.use_ema:
        raise ValueError("ZeroRedundancyOptimizer does not support use_ema=True (the moving averages would live on "
                         "the owners only); use hvd.DistributedOptimizer for EMA.")


def _zero_class(base: type, settings: _Settings) -> type:
    """A subclass of ``base`` that shards its state over ``settings.process_set`` (the module's docstring)."""

    class _ZeroRedundancyOptimizer(base):
        _hvd_zero = settings

        def build(self, variables):
            if self.built:
                return
            s = type(self)._hvd_zero
            variables = list(variables)
            member = bool(s.process_set.included())
            size = s.process_set.size() if member else 1
            rank = s.process_set.rank() if member else 0
            shards = _Shards(variables, size, rank)
            object.__setattr__(self, "_hvd_shards", shards)
            object.__setattr__(self, "_hvd_variables", tuple(variables))
            object.__setattr__(self, "_hvd_index", {self._var_key(v): i for i, v in enumerate(variables)})
            owned = [v for i, v in enumerate(variables) if shards.mine(i)]
            logger.debug("%s: rank %d of %d owns %d of %d variables (%d of %d elements)", s.name, rank, size,
                         len(owned), len(variables), sum(n for i, n in enumerate(shards.numels) if shards.mine(i)),
                         sum(shards.numels))
            super().build(owned)
            if s.backward_passes_per_step > 1:
                from horovod._keras.optimizer import _add_aggregation_state

                _add_aggregation_state(self, variables)

        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if not grads:
                return super().apply(grads, trainable_variables)
            if trainable_variables is None:
                if not self.built:
                    raise ValueError("Build the optimizer (optimizer.build(model.trainable_variables)) or pass "
                                     "the variables before applying gradients without them.")
                variables = list(self._hvd_variables)
                if len(grads) != len(variables):
                    raise ValueError(f"Got {len(grads)} gradients for the {len(variables)} variables the optimizer "
                                     "was built with; pass them one-to-one, or pass the variables too.")
            else:
                variables = list(trainable_variables)
                if not self.built:
                    with keras.name_scope(self.name, caller=self):
                        self.build(variables)
                    self.built = True
            full: List[Any] = [None] * len(self._hvd_variables)
            for g, v in zip(grads, variables):
                i = self._hvd_index.get(self._var_key(v))
                if i is None:
                    raise ValueError(f"Variable {v.path} is not one the ZeroRedundancyOptimizer was built with; "
                                     "build it once with every variable it will update "
                                     "(optimizer.build(model.trainable_variables)).")
                full[i] = g
            if self._hvd_zero.backward_passes_per_step > 1:
                return self._hvd_apply_aggregated(full)
            return self._hvd_apply(full)

        def _hvd_apply(self, full: List[Any]) -> None:
            """Exchange and apply the gradients ``full`` (indexed as the build's variables; None: no gradient)."""
            s, shards, variables = self._hvd_zero, self._hvd_shards, list(self._hvd_variables)
            if shards.size == 1:
                present = [i for i, g in enumerate(full) if g is not None]
                return super().apply([full[i] for i in present], [variables[i] for i in present])
            reduced = shards.reduce(full, s.name, s.process_set)
            mine = [i for i in sorted(reduced) if full[i] is not None]
            if mine:
                super().apply([reduced[i] for i in mine], [variables[i] for i in mine])
            else:
                self._iterations.assign_add(1)
            shards.gather(variables, s.name, s.process_set)

        def _hvd_apply_aggregated(self, full: List[Any]) -> None:
            """``backward_passes_per_step`` > 1: sum locally, exchange and apply on every N-th call (as
            ``DistributedOptimizer``); the other calls only advance ``iterations``."""
            s = self._hvd_zero
            n = s.backward_passes_per_step
            for g, slot in zip(full, self._hvd_aggregated):
                if g is not None:
                    slot.assign_add(backend_ops.to_dense(g))
            self._hvd_counter.assign_add(1)
            present = [g is not None for g in full]

            def update():
                scale = 1.0 / n if s.average_aggregated_gradients else 1.0
                summed = [keras.ops.convert_to_tensor(slot) * scale if p else None
                          for slot, p in zip(self._hvd_aggregated, present)]
                self._hvd_apply(summed)
                for slot in self._hvd_aggregated:
                    slot.assign(keras.ops.zeros_like(slot))
                self._hvd_counter.assign(0)

            def skip():
                self._iterations.assign_add(1)

            keras.ops.cond(keras.ops.greater_equal(self._hvd_counter, n), update, skip)

        def consolidated_optimizer(self) -> Any:
            """A plain optimizer of the wrapped class, built over every variable, holding the whole state (every
            owner's slots; ``iterations`` and the rest are this rank's). Call it on every rank of the process
            set (one allgather of the shards, as Python objects); every rank gets the whole copy. Save it, e.g.
            with ``tf.train.Checkpoint(optimizer=...)`` or its ``variables``; a snapshot, not kept in sync."""
            if not self.built:
                raise ValueError("The optimizer has no state before it is built; build or apply it first.")
            s = type(self)._hvd_zero
            whole = base.from_config(self.get_config())
            whole.build(list(self._hvd_variables))
            names = [v.name for v in whole.variables]
            if len(set(names)) != len(names):
                raise ValueError("Two optimizer variables share a name (two model variables with one path?); "
                                 "give the layers unique names to consolidate the state.")
            own = {v.name: np.asarray(v.numpy()) for v in self.variables}
            shards = ([own] if not s.process_set.included() else
                      ops.allgather_object(own, name=f"{s.name}.consolidate", process_set=s.process_set))
            merged: Dict[str, np.ndarray] = {}
            for shard in shards:
                merged.update(shard)
            merged.update(own)
            for v in whole.variables:
                if v.name not in merged:
                    raise ValueError(f"No rank holds optimizer variable {v.name!r}: were all the ranks' optimizers "
                                     "built with the same variables?")
                v.assign(merged[v.name])
            return whole

        def load_consolidated(self, optimizer: Any) -> None:
            """Take this rank's part of the state from ``optimizer``, a plain optimizer of the same class built
            over the same variables (``consolidated_optimizer()``'s, or one restored from a checkpoint), by
            variable name. No collectives: call it on every rank with the same whole state."""
            if not self.built:
                raise ValueError("Build the optimizer (optimizer.build(model.trainable_variables)) before loading "
                                 "a state into it.")
            values = {v.name: v for v in optimizer.variables}
            for v in self.variables:
                if v.name not in values:
                    raise ValueError(f"The given optimizer has no variable {v.name!r}; give a "
                                     f"{base.__name__} built over the same model variables.")
                v.assign(values[v.name])

    _ZeroRedundancyOptimizer.__name__ = base.__name__
    _ZeroRedundancyOptimizer.__qualname__ = base.__qualname__
    _ZeroRedundancyOptimizer.__module__ = base.__module__
    return _ZeroRedundancyOptimizer


def create_zero_optimizer(optimizer: Any, process_set: ProcessSet = global_process_set,
                          backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                          name: Optional[str] = None) -> Any:
    """Wrap a Keras 3 optimizer instance (TensorFlow backend) so that its state is sharded over ``process_set``
    (the module's docstring). The variables end as ``hvd.DistributedOptimizer(optimizer)`` would leave them."""
    _check_supported(optimizer)
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    settings = _Settings(name=name or f"ZeroRedundancy{type(optimizer).__name__}", process_set=process_set,
                         backward_passes_per_step=int(backward_passes_per_step),
                         average_aggregated_gradients=average_aggregated_gradients)
    return _zero_class(type(optimizer), settings).from_config(optimizer.get_config())
