"""PowerSGD for horovod.tensorflow's ``DistributedGradientTape`` and ``DistributedOptimizer`` and for Keras 3's
``DistributedOptimizer`` on the TensorFlow backend: the algorithm of ``horovod/jax/powersgd.py`` (DDP's
``powerSGD_hook``) in TensorFlow ops, eagerly and inside ``tf.function``.

Each dense floating-point gradient is viewed as an n x m matrix (``tf.reshape(g, [shape[0], -1])``) and compressed
when ``(n + m) * r * min_compression_rate < n * m`` (``r = min(n, m, R)``). For the first ``start_powerSGD_iter``
reductions every gradient is allreduced as without PowerSGD. After that, per reduction: the gradients that are not
compressed are allreduced as they are (the caller's groups); then ``M += error``, ``P = M Q`` (``Q`` orthonormalised
first), one grouped allreduce (Sum) of every ``P``, Gram-Schmidt, ``Q = M^T P``, one grouped allreduce of every
``Q`` (the optimizer's op and scale factors: Average gives the mean), ``M ~ P Q^T``, ``error = M - P Q^T``. Inside
a ``tf.function`` the choice is a ``tf.cond`` on the step count (a ``tf.Variable``, the same on every rank).

State (:class:`PowerSGDState`): a step count per set of compressed gradients, and per compressed gradient its ``Q``
(m x r, the same on every rank) and this rank's error feedback (n x m), all ``tf.Variable``s made on first use (in
``tf.init_scope``, so a ``tf.function`` may make them on its first trace). A gradient is known by its variable when
the caller passes the variables (the tape's sources, the optimizer's variables), else by its position and shape.
The first ``Q`` of the gradient at position ``i`` of the list given to :meth:`PowerSGDState.reduce` (the dense
gradients a tape or optimizer reduces: None gradients and local variables' left out) is
``tf.random.stateless_normal((m, r), seed=[crc32(f"{random_seed}.{i}") & 0x7FFFFFFF, step], dtype=float32)``
cast to the gradient's dtype (``step`` is ``start_powerSGD_iter`` with warm start, the current step without), so
every rank draws the same ``Q`` without a broadcast.

The state is not part of any checkpoint; see docs/compression.md ("TensorFlow and Keras") for save/restore and
elastic resets (:meth:`PowerSGDState.reset`; ``hvd.elastic.run`` calls :func:`reset_all_states`).
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
import zlib
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod.common.compression import PowerSGDCompressor

log = logging.getLogger(__name__)

# (tensors, name) -> the tensors reduced as one grouped allreduce: with the optimizer's op and scale factors, or
# (``Sum``) summed and unscaled.
GroupedAllreduce = Callable[[List[tf.Tensor], str], List[tf.Tensor]]
# (gradients, positions) -> the gradients with those positions reduced plainly (the caller's groups and checks).
PlainReduce = Callable[[List[tf.Tensor], List[int]], List[tf.Tensor]]


def seed_of(settings: PowerSGDCompressor, position: int) -> int:
    """The seed of the first ``Q`` of the gradient at ``position``: the same on every rank."""
    return zlib.crc32(f"{settings.random_seed}.{position}".encode()) & 0x7FFFFFFF


def first_q(seed: int, step, m: int, r: int, dtype: tf.DType) -> tf.Tensor:
    """A fresh ``Q`` (m x r): standard-normal float32 values from a stateless generator, cast to ``dtype``."""
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])
    return tf.cast(tf.random.stateless_normal((m, r), seed=key, dtype=tf.float32), dtype)


def orthogonalize(matrix: tf.Tensor, epsilon: float = 0.0) -> tf.Tensor:
    """``matrix`` (n x r) with orthonormal columns, by DDP's (modified) Gram-Schmidt: a zero column stays zero
    when ``epsilon`` is 0; otherwise each column is divided by its norm plus ``epsilon``."""
    r = int(matrix.shape[1])
    cols = [matrix[:, i:i + 1] for i in range(r)]
    for i in range(r):
        col = cols[i]
        norm = tf.norm(col)
        col = col * tf.math.divide_no_nan(tf.ones_like(norm), norm) if epsilon == 0 else col / (norm + epsilon)
        cols[i] = col
        for j in range(i + 1, r):
            cols[j] = cols[j] - col * tf.reduce_sum(col * cols[j])
    return tf.concat(cols, axis=1) if r > 1 else cols[0]


@dataclasses.dataclass
class _Slot:
    """One compressed gradient's state."""

    n: int
    m: int
    r: int
    seed: int
    q: tf.Variable
    error: Optional[tf.Variable]


class PowerSGDState:
    """PowerSGD's state for one optimizer (or, for ``DistributedGradientTape``, one shared entry of
    :func:`shared_state`): the step counts and the per-gradient ``Q`` and error feedback, in ``tf.Variable``s."""

    def __init__(self, settings: PowerSGDCompressor, name: str) -> None:
        self.settings = settings
        self.name = name
        self._steps: Dict[Tuple[Hashable, ...], tf.Variable] = {}
        self._slots: Dict[Hashable, _Slot] = {}
        _LIVE.add(self)

    def variables(self) -> List[tf.Variable]:
        """Every ``tf.Variable`` of the state (step counts, ``Q``s, error feedback), e.g. to checkpoint them
        with ``tf.train.Checkpoint`` (the error feedback is this rank's own)."""
        out = list(self._steps.values())
        for slot in self._slots.values():
            out.append(slot.q)
            if slot.error is not None:
                out.append(slot.error)
        return out

    def reset(self) -> None:
        """Start again as after construction: step counts 0 (the plain phase again), first ``Q``s, zero error
        feedback. The variables stay, so traced ``tf.function``s keep working. Call it on every rank at once
        (after an elastic reset, or after restoring a checkpoint that did not hold the state)."""
        for step in self._steps.values():
            step.assign(0)
        for slot in self._slots.values():
            slot.q.assign(first_q(slot.seed, self.settings.start_powerSGD_iter, slot.m, slot.r, slot.q.dtype))
            if slot.error is not None:
                slot.error.assign(tf.zeros_like(slot.error))

    def compressed_positions(self, grads: Sequence) -> List[int]:
        """The positions of ``grads`` that PowerSGD compresses (None and ``tf.IndexedSlices`` never are)."""
        out = []
        for i, g in enumerate(grads):
            if g is None or isinstance(g, tf.IndexedSlices) or not g.dtype.is_floating:
                continue
            if g.shape.rank is None or not g.shape.is_fully_defined():
                continue
            if self.settings.approximation_rank(g.shape.as_list()):
                out.append(i)
        return out

    def _slot(self, key: Hashable, position: int, grad: tf.Tensor) -> _Slot:
        slot = self._slots.get(key)
        shape = grad.shape.as_list()
        n, m, r = shape[0], int(grad.shape.num_elements()) // max(shape[0], 1), \
            self.settings.approximation_rank(shape)
        if slot is not None:
            if (slot.n, slot.m, slot.r) != (n, m, r) or slot.q.dtype != grad.dtype:
                raise ValueError(f"Compression.powersgd: the gradient at position {position} ({self.name}) is "
                                 f"{n} x {m} {grad.dtype.name} now but was {slot.n} x {slot.m} "
                                 f"{slot.q.dtype.name}; a DistributedOptimizer (or tape) with PowerSGD must see "
                                 "the same variables each step. Use a new one for a different model.")
            return slot
        seed = seed_of(self.settings, position)
        with tf.init_scope():
            q = tf.Variable(first_q(seed, self.settings.start_powerSGD_iter, m, r, grad.dtype), trainable=False,
                            name=f"powersgd_q_{position}")
            error = (tf.Variable(tf.zeros((n, m), grad.dtype), trainable=False, name=f"powersgd_error_{position}")
                     if self.settings.use_error_feedback else None)
        slot = _Slot(n, m, r, seed, q, error)
        self._slots[key] = slot
        return slot

    def _step(self, keys: Tuple[Hashable, ...]) -> tf.Variable:
        step = self._steps.get(keys)
        if step is None:
            with tf.init_scope():
                step = tf.Variable(0, dtype=tf.int64, trainable=False, name="powersgd_step")
            self._steps[keys] = step
        return step

    def reduce(self, grads: List, keys: Sequence[Hashable], plain: PlainReduce, grouped: GroupedAllreduce,
               summed: GroupedAllreduce, base: str) -> List:
        """The reduced gradients: ``plain`` for all of them during the first ``start_powerSGD_iter`` calls, then
        ``plain`` for those not compressed and PowerSGD's two rounds (``summed`` for P, ``grouped`` for Q) for the
        others. ``grads`` are dense tensors (the caller handles None and sparse gradients); ``keys[i]``
        identifies gradient ``i`` from call to call. Gradients that are not floating-point or lack a fully known
        shape are not compressed."""
        if not tf.executing_eagerly() and not getattr(tf.compat.v1.get_default_graph(), "building_function", False):
            raise NotImplementedError("Compression.powersgd in horovod.tensorflow runs eagerly or inside a "
                                      "tf.function (TF2); a TF1 graph (tf.compat.v1 sessions) is not supported. "
                                      "Use Compression.none, fp16 or bf16 there.")
        grads = list(grads)
        compressed = self.compressed_positions(grads)
        others = [i for i, g in enumerate(grads) if g is not None and i not in compressed]
        if not compressed:
            return plain(grads, others)
        slots = [self._slot(keys[i], i, grads[i]) for i in compressed]
        step = self._step(tuple(keys[i] for i in compressed))
        everything = sorted(compressed + others)

        def plain_branch() -> List[tf.Tensor]:
            out = plain(list(grads), everything)
            return [out[i] for i in everything]

        def powersgd_branch() -> List[tf.Tensor]:
            out = plain(list(grads), others) if others else list(grads)
            for i, r in zip(compressed, self._compress(grads, compressed, slots, step, grouped, summed, base)):
                out[i] = r
            return [out[i] for i in everything]

        if tf.executing_eagerly():
            values = (powersgd_branch if int(step.numpy()) >= self.settings.start_powerSGD_iter
                      else plain_branch)()
        else:
            values = tf.cond(step >= self.settings.start_powerSGD_iter, powersgd_branch, plain_branch)
        with tf.control_dependencies(values):
            step.assign_add(1)
        out = list(grads)
        for i, v in zip(everything, values):
            out[i] = v
        return out

    def _compress(self, grads: List, compressed: List[int], slots: List[_Slot], step: tf.Variable,
                  grouped: GroupedAllreduce, summed: GroupedAllreduce, base: str) -> List[tf.Tensor]:
        s = self.settings
        epsilon = float(s.orthogonalization_epsilon)
        matrices, ps = [], []
        for i, slot in zip(compressed, slots):
            matrix = tf.reshape(grads[i], (slot.n, slot.m))
            if slot.error is not None:
                matrix = matrix + slot.error
            q = slot.q if s.warm_start else first_q(slot.seed, step, slot.m, slot.r, slot.q.dtype)
            q = orthogonalize(tf.convert_to_tensor(q), epsilon)
            matrices.append(matrix)
            ps.append(tf.matmul(matrix, q))
        ps = [orthogonalize(p, epsilon) for p in summed(ps, f"{base}.powersgd.p")]
        qs = grouped([tf.matmul(matrix, p, transpose_a=True) for matrix, p in zip(matrices, ps)],
                     f"{base}.powersgd.q")
        out = []
        for i, slot, matrix, p, q in zip(compressed, slots, matrices, ps, qs):
            approximation = tf.matmul(p, q, transpose_b=True)
            if slot.error is not None:
                slot.error.assign(matrix - approximation)
            if s.warm_start:
                slot.q.assign(q)
            out.append(tf.reshape(approximation, tf.shape(grads[i])))
        return out


_SHARED: Dict[Tuple[PowerSGDCompressor, str, Tuple[int, ...]], PowerSGDState] = {}
_LIVE: weakref.WeakSet[PowerSGDState] = weakref.WeakSet()   # every state of this process (reset_all_states)


def shared_state(settings: PowerSGDCompressor, name: str, ranks: Sequence[int]) -> PowerSGDState:
    """The process-wide state for ``DistributedGradientTape``s (made anew every step, so they cannot hold it):
    one per settings (equal settings share it), name and process set (its ``ranks``); inside it, gradients are
    known by their variables, so two models trained with one setting keep apart."""
    key = (settings, name, tuple(int(r) for r in ranks))
    state = _SHARED.get(key)
    if state is None:
        state = _SHARED[key] = PowerSGDState(settings, name)
        log.debug("PowerSGD: new shared state for %s on ranks %s", name, list(key[2]))
    return state


def reset_all_states() -> None:
    """:meth:`PowerSGDState.reset` on every PowerSGD state of this process, the optimizers' and the tapes'. The
    elastic reset of horovod.tensorflow and horovod.keras calls it after re-forming the job, on every rank, so
    that survivors and new ranks start from the same step count (the plain phase again) and the same ``Q``s."""
    for state in list(_LIVE):
        state.reset()


def refuse_sparse(label: str) -> ValueError:
    """The error for a sparse gradient under PowerSGD without ``sparse_as_dense``."""
    return ValueError(f"Compression.powersgd compresses dense matrices, but the gradient of {label!r} is a "
                      "tf.IndexedSlices (sparse, e.g. from an embedding lookup). Pass sparse_as_dense=True (its "
                      "dense form is then compressed), or use Compression.none, fp16 or bf16.")
