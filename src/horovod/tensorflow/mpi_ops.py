"""``horovod.tensorflow`` collectives on TF tensors, eager and inside ``tf.function``, with upstream's gradients.

Eagerly, a collective hands ``np.asarray(tensor)`` (a view of CPU tensors' memory) to the op layer and wraps the
result in a tensor. In a graph the same Python body runs at execution time in a ``HorovodCollective`` op (a
kernel registered through TensorFlow's C API, ``kernel.py``), placed so that no graph can deadlock
(``graph_call.py``); output shapes are set where they are known. Errors are upstream's ``tf.errors`` classes
(``errors.py``).

Tensor names, which every rank must submit in the same order:

- a user ``name`` gives ``<op>.<name>`` (with the current name scope in front unless ``ignore_name_scope``);
- eagerly, an unnamed op gets ``<op>.noname.<n>`` from the process-wide counter (as ``horovod.torch``);
- in a graph, an unnamed op gets ``<op>.<graph-unique node name>`` (``allreduce.HorovodAllreduce_2``), fixed
  at trace time and independent of how often each rank happened to retrace.

Gradients follow upstream: allreduce -> allreduce of the gradient with the same op and scale factors;
allgather -> the gradient averaged across ranks, then this rank's rows; broadcast -> the gradient averaged,
zero on non-root ranks; alltoall -> alltoall of the gradient with the received splits; reducescatter -> the
gradient times the set size (op Sum only), times the prescale and postscale factors, then allgathered.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from horovod.common import types as _types
from horovod.common.types import Adasum, Average, ReduceOp, Sum  # noqa: F401  (Adasum: re-exported)
from horovod.common.util import get_average_backwards_compatibility_fun, num_rank_is_power_2
from horovod.core import basics, ops
from horovod.core.api import *  # noqa: F403  (the op layer's public names, re-exported as upstream's mpi_ops does)
from horovod.core.basics import rank, size
from horovod.core.ops import set_rank as _set_rank
from horovod.core.ops import set_size as _set_size
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow import errors
from horovod.tensorflow.graph_call import call as _call
from horovod.tensorflow.graph_call import collective_chain  # noqa: F401  (re-exported)
from horovod.tensorflow.util import _executing_eagerly

try:
    from tensorflow.python.eager.record import could_possibly_record as _could_possibly_record
except ImportError:  # pragma: no cover - older or newer TF without the private helper: always record
    def _could_possibly_record() -> bool:
        return True

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_types)
# Upstream's ``_HorovodBasics`` instance of the loaded extension: its private helpers
# (``_get_process_set_ids_and_ranks``, ``_process_set_size`` ...) are the op layer's basics here.
_basics = basics

# The collectives build ops and have no data-dependent Python control flow: autograph (a tf.function tracing the
# caller) calls them as they are, instead of converting them and everything they call, at every trace. It also
# re-raises their errors unchanged.
_no_autograph = tf.autograph.experimental.do_not_convert

_REDUCE_DTYPES = {tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
                  tf.float64}
_MOVE_DTYPES = _REDUCE_DTYPES | {tf.bool}


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a power of two (upstream's name for Adasum's check)."""
    return num_rank_is_power_2(num_rank)


# ---------------------------------------------------------------------------------------------- plumbing
def _check(tensor: tf.Tensor, allowed: set, what: str) -> None:
    if tensor.dtype not in allowed:
        names = ", ".join(sorted(d.name for d in allowed))
        raise errors.make(errors.InvalidArgumentError, (
            f"Tensor type {tensor.dtype.name} is not supported by {what}. Supported types: {names}. "
            "Cast the tensor (for example tf.cast(t, tf.float32)) before the collective."
        ))


def _tensor(value, allowed: set, what: str) -> tf.Tensor:
    if isinstance(value, tf.IndexedSlices):
        raise errors.make(errors.InvalidArgumentError, (
            f"{what} does not take tf.IndexedSlices; use allreduce, or "
            "tf.convert_to_tensor first."
        ))
    tensor = tf.convert_to_tensor(value)
    _check(tensor, allowed, what)
    return tensor


def _read(variable) -> tf.Tensor:
    """The current value of a tf.Variable, a Keras variable or a tensor."""
    return variable.read_value() if hasattr(variable, "read_value") else tf.convert_to_tensor(variable)


def _name(op: str, name: Optional[str], ignore_name_scope: bool = False,
          process_set: Optional[ProcessSet] = None) -> str:
    """The negotiated tensor name (see the module docstring). Every collective asks for it when it is built, so a
    process set that is not registered is refused here, in Python, with upstream's ValueError (not from inside the
    graph at run time)."""
    basics.registered_set(process_set)
    if name:
        scope = "" if ignore_name_scope else tf.get_current_name_scope()
        return f"{op}.{scope}/{name}" if scope else f"{op}.{name}"
    if tf.executing_eagerly():
        return ops.tensor_name(op, None, process_set=process_set)
    node = "Horovod" + "".join(part.capitalize() for part in op.split("_"))
    return f"{op}.{tf.compat.v1.get_default_graph().unique_name(node)}"


def _apply(fwd: Callable, *tensors):
    """``fwd`` returns (outputs, grad_fn): register the gradient with tf.custom_gradient, except eagerly when no
    tape is recording (custom_gradient costs about as much Python time as a small collective itself)."""
    if tf.executing_eagerly() and not _could_possibly_record():
        return fwd(*tensors)[0]
    return tf.custom_gradient(fwd)(*tensors)


def _wait_all(handle) -> List[np.ndarray]:
    """A grouped op's results, as a list."""
    result = handle.wait()
    return list(result)


def _set_shape(tensor: tf.Tensor, shape) -> tf.Tensor:
    if not tf.executing_eagerly():
        tensor.set_shape(shape)
    return tensor


def _rows_shape(shape: tf.TensorShape, rows=None) -> tf.TensorShape:
    if shape.rank is None:
        return tf.TensorShape(None)
    return tf.TensorShape([rows]).concatenate(shape[1:])


def _zeros_for_none(grads, like):
    return [tf.zeros_like(x) if g is None else g for g, x in zip(grads, like)]


# ---------------------------------------------------------------------------------------------- size ops
def _scalar_op(value_fn: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    if tf.executing_eagerly():
        return tf.constant(value_fn(), dtype=tf.int32)
    out = tf.numpy_function(lambda: np.int32(value_fn()), [], tf.int32, stateful=True, name=name or "HorovodSize")
    out.set_shape([])
    return out


@_no_autograph
def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with the number of ranks in the process set (the job by default), read when the op runs
    (not when it is traced)."""
    if process_set_id == 0:
        return _scalar_op(basics.size, name)
    return _scalar_op(lambda: basics._process_set_size(process_set_id), name)


@_no_autograph
def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with the number of ranks on this host."""
    return _scalar_op(basics.local_size, name)


@_no_autograph
def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with this process's rank."""
    return _scalar_op(basics.rank, name)


@_no_autograph
def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with this process's rank on its host."""
    return _scalar_op(basics.local_rank, name)


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar: 1 if this rank belongs to the process set, else 0 (read when the op runs)."""
    return _scalar_op(lambda: int(basics._process_set_rank(process_set_id) >= 0), name)


# ---------------------------------------------------------------------------------------------- allreduce
@_no_autograph
def _allreduce(tensor, name: Optional[str] = None, op: ReduceOp = Sum, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Differentiable allreduce of one dense tensor (the op layer's op; Average divides by the set size)."""
    tensor = _tensor(tensor, _REDUCE_DTYPES, "allreduce")
    op = ReduceOp(op)
    full = _name("allreduce", name, ignore_name_scope, process_set)

    def fwd(x):
        def compute(outputs, a):
            out = outputs.empty(0, a.shape, a.dtype)
            with ops.blocking():        # waited at once: a fast round or a carried op may take it
                return [ops.allreduce_async(a, out, full, op, prescale_factor, postscale_factor, process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodAllreduce")[0], x.shape)

        def grad(dy):
            return _allreduce(dy, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                              ignore_name_scope=ignore_name_scope, process_set=process_set)

        return out, grad

    return _apply(fwd, tensor)


@_no_autograph
def _grouped_allreduce(tensors, name: Optional[str] = None, op: ReduceOp = Sum, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    tensors = [_tensor(t, _REDUCE_DTYPES, "grouped_allreduce") for t in tensors]
    if not tensors:
        return []
    op = ReduceOp(op)
    base = _name("grouped_allreduce", name, ignore_name_scope, process_set)

    def fwd(*xs):
        def compute(outputs, *arrays):
            outs = [outputs.empty(i, a.shape, a.dtype) for i, a in enumerate(arrays)]
            with ops.blocking():
                return _wait_all(ops.grouped_allreduce_async(list(arrays), outs, base, op, prescale_factor,
                                                             postscale_factor, process_set))

        outs = _call(compute, xs, [x.dtype for x in xs], "HorovodGroupedAllreduce")
        outs = [_set_shape(o, x.shape) for o, x in zip(outs, xs)]

        def grad(*dys):
            return _grouped_allreduce(_zeros_for_none(dys, xs), op=op, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                      process_set=process_set)

        return outs, grad

    return list(_apply(fwd, *tensors))


# ---------------------------------------------------------------------------------------------- allgather
def _gather_grad_compute(rank_: int, names: List[str], dims_names: List[str], process_set):
    """Backward of (grouped) allgather in one callback: average each gradient over the set, keep the rows of
    ``rank_`` (this rank's position in the set)."""
    def compute(outputs, *arrays):
        n = len(arrays) // 2
        grads, dims = arrays[:n], arrays[n:]
        reduced = [ops.allreduce_async(g, None, nm, Average, process_set=process_set) for g, nm in zip(grads, names)]
        gathered = [ops.allgather_async(np.asarray(d, np.int64).reshape(1), dn, process_set=process_set)
                    for d, dn in zip(dims, dims_names)]
        outs = []
        for r, g in zip(reduced, gathered):
            full, all_dims = r.wait(), g.wait()
            offset = int(all_dims[:rank_].sum())
            outs.append(full[offset:offset + int(all_dims[rank_])])
        return outs
    return compute


def _allgather_grads(dys, xs, ignore_name_scope, process_set):
    names = [_name("allreduce", None, ignore_name_scope, process_set) for _ in dys]
    dims_names = [_name("allgather", None, ignore_name_scope, process_set) for _ in dys]
    dims = [tf.shape(x, out_type=tf.int64)[0] for x in xs]
    outs = _call(_gather_grad_compute(_set_rank(process_set), names, dims_names, process_set), [*dys, *dims],
                 [x.dtype for x in xs], "HorovodAllgatherGrad")
    return [_set_shape(o, x.shape) for o, x in zip(outs, xs)]


def _at_least_1d(tensors, what: str) -> None:
    if any(t.shape.rank == 0 for t in tensors):
        raise errors.make(errors.InvalidArgumentError, (
            f"{what} does not support scalar inputs: give the tensor a first "
            "dimension (for example tf.reshape(t, [1]))."
        ))


@_no_autograph
def allgather(tensor, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks); differentiable."""
    tensor = _tensor(tensor, _MOVE_DTYPES, "allgather")
    _at_least_1d([tensor], "Allgather")
    full = _name("allgather", name, ignore_name_scope, process_set)

    def fwd(x):
        def compute(outputs, a):
            with ops.blocking():
                return [ops.allgather_async(a, full, outputs.allocator(0), process_set=process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodAllgather")[0], _rows_shape(x.shape))

        def grad(dy):
            return _allgather_grads([dy], [x], ignore_name_scope, process_set)[0]

        return out, grad

    return _apply(fwd, tensor)


@_no_autograph
def grouped_allgather(tensors, name: Optional[str] = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgather each tensor of a list, negotiated as one unit; differentiable."""
    tensors = [_tensor(t, _MOVE_DTYPES, "grouped_allgather") for t in tensors]
    if not tensors:
        return []
    _at_least_1d(tensors, "Allgather")
    base = _name("grouped_allgather", name, ignore_name_scope, process_set)

    def fwd(*xs):
        def compute(outputs, *arrays):
            allocators = [outputs.allocator(i) for i in range(len(arrays))]
            return _wait_all(ops.grouped_allgather_async(list(arrays), base, allocators, process_set=process_set))

        outs = _call(compute, xs, [x.dtype for x in xs], "HorovodGroupedAllgather")
        outs = [_set_shape(o, _rows_shape(x.shape)) for o, x in zip(outs, xs)]

        def grad(*dys):
            return _allgather_grads(_zeros_for_none(dys, outs), xs, ignore_name_scope, process_set)

        return outs, grad

    return list(_apply(fwd, *tensors))


# ---------------------------------------------------------------------------------------------- broadcast
def _check_root(root_rank) -> int:
    root_rank = int(root_rank)
    if not 0 <= root_rank < size():
        raise errors.make(errors.InvalidArgumentError, (
            f"broadcast received invalid root rank {root_rank}: the job has {size()} "
            f"ranks (valid roots are 0..{size() - 1})."
        ))
    return root_rank


@_no_autograph
def broadcast(tensor, root_rank: int, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` (a global rank) on every rank; differentiable."""
    tensor = _tensor(tensor, _MOVE_DTYPES, "broadcast")
    root_rank = _check_root(root_rank)
    full = _name("broadcast", name, ignore_name_scope, process_set)

    def fwd(x):
        def compute(outputs, a):
            out = outputs.empty(0, a.shape, a.dtype)
            with ops.blocking():
                return [ops.broadcast_async(a, root_rank, out, full, process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodBroadcast")[0], x.shape)

        def grad(dy):
            reduced = _allreduce(dy, op=Average, ignore_name_scope=ignore_name_scope, process_set=process_set)
            return reduced if rank() == root_rank else reduced * 0

        return out, grad

    return _apply(fwd, tensor)


def _broadcast_many(tensors: List[tf.Tensor], root_rank: int, base: str, process_set) -> List[tf.Tensor]:
    """Broadcast several tensors in one callback (all started, then awaited: the engine fuses them)."""
    root_rank = _check_root(root_rank)
    names = [f"{base}.{i}" for i in range(len(tensors))]

    def compute(outputs, *arrays):
        handles = [ops.broadcast_async(a, root_rank, outputs.empty(i, a.shape, a.dtype), n, process_set)
                   for i, (a, n) in enumerate(zip(arrays, names))]
        return [h.wait() for h in handles]

    outs = _call(compute, tensors, [t.dtype for t in tensors], "HorovodBroadcastInplace")
    return [_set_shape(o, t.shape) for o, t in zip(outs, tensors)]


@_no_autograph
def broadcast_(variables, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Overwrite each variable with ``root_rank``'s value (one fused exchange); returns the variables' new values,
    as upstream (in a graph, reading them runs the broadcast)."""
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    if not variables:
        return []
    values = [_tensor(_read(v), _MOVE_DTYPES, "broadcast_") for v in variables]
    outs = _broadcast_many(values, root_rank, _name("broadcast_", name, process_set=process_set), process_set)
    assigns = [v.assign(o) for v, o in zip(variables, outs) if hasattr(v, "assign")]
    if _executing_eagerly():
        return [_read(v) if hasattr(v, "assign") else o for v, o in zip(variables, outs)]
    with tf.control_dependencies(assigns):
        return [_read(v) if hasattr(v, "assign") else tf.identity(o) for v, o in zip(variables, outs)]


# ---------------------------------------------------------------------------------------------- alltoall
@_no_autograph
def alltoall(tensor, splits=None, name: Optional[str] = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[j]`` rows to rank j (dim 0 split equally without splits, or with empty splits).

    Returns ``(output, received_splits)`` when ``splits`` is given, else only ``output`` (as upstream);
    differentiable in ``tensor``.
    """
    tensor = _tensor(tensor, _MOVE_DTYPES, "alltoall")
    _at_least_1d([tensor], "Alltoall")
    if splits is None:
        splits_t = tf.zeros([0], tf.int32)
    else:
        splits_t = tf.convert_to_tensor(splits)
        if not (splits_t.dtype.is_integer or splits_t.shape.num_elements() == 0):
            raise errors.make(errors.InvalidArgumentError, (
                f"alltoall splits must be integers, got {splits_t.dtype.name}."
            ))
        splits_t = tf.reshape(tf.cast(splits_t, tf.int32), [-1])
    full = _name("alltoall", name, ignore_name_scope, process_set)
    n = _set_size(process_set)
    received_out: List[tf.Tensor] = []

    def compute(outputs, a, sp):
        out, received = ops.alltoall_async(a, sp.tolist() if sp.size else None, full,
                                           allocate=outputs.allocator(0), process_set=process_set).wait()
        return [out, np.asarray(received, np.int32)]

    def fwd(x):
        out, received = _call(compute, [x, splits_t], [x.dtype, tf.int32], "HorovodAlltoall")
        received_out.append(_set_shape(received, [n]))

        def grad(dy):
            back, _ = alltoall(dy, received, ignore_name_scope=ignore_name_scope, process_set=process_set)
            return back

        return _set_shape(out, _rows_shape(x.shape)), grad

    out = _apply(fwd, tensor)
    return (out, received_out[0]) if splits is not None else out


# ---------------------------------------------------------------------------------------------- reducescatter
def _scatter_rows(shape: tf.TensorShape, process_set: ProcessSet):
    """This rank's rows of a reducescatter of ``shape`` over ``process_set`` (None when unknown)."""
    n, r = _set_size(process_set), _set_rank(process_set)
    if shape.rank is None or shape[0] is None or r is None:
        return None
    return shape[0] // n + (1 if r < shape[0] % n else 0)


def _reducescatter_grads(dys, xs, op, prescale_factor, postscale_factor, ignore_name_scope, process_set):
    """Upstream's backward: the gradient times the set size (op Sum), times the prescale and postscale factors,
    then allgathered."""
    if op == Sum:
        dys = [d * _set_size(process_set) for d in dys]
    if prescale_factor != 1.0:
        dys = [d * prescale_factor for d in dys]
    if postscale_factor != 1.0:
        dys = [d * postscale_factor for d in dys]
    base = _name("grouped_allgather", None, ignore_name_scope, process_set)

    def compute(outputs, *arrays):
        allocators = [outputs.allocator(i) for i in range(len(arrays))]
        return _wait_all(ops.grouped_allgather_async(list(arrays), base, allocators, process_set=process_set))

    outs = _call(compute, dys, [d.dtype for d in dys], "HorovodReducescatterGrad")
    return [_set_shape(o, x.shape) for o, x in zip(outs, xs)]


@_no_autograph
def _reducescatter_many(tensors, name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set,
                        grouped: bool) -> List[tf.Tensor]:
    what = "grouped_reducescatter" if grouped else "reducescatter"
    tensors = [_tensor(t, _REDUCE_DTYPES, what) for t in tensors]
    _at_least_1d(tensors, "Reducescatter")
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise errors.make(errors.AbortedError, (
            f"Reducescatter currently only supports AVERAGE and SUM, not "
            f"{op.name.capitalize()}; pass op=hvd.Sum or op=hvd.Average."
        ))
    base = _name(what, name, ignore_name_scope, process_set)

    def fwd(*xs):
        def compute(outputs, *arrays):
            if grouped:
                allocators = [outputs.allocator(i) for i in range(len(arrays))]
                return _wait_all(ops.grouped_reducescatter_async(list(arrays), base, op, prescale_factor,
                                                                 postscale_factor, allocators, process_set))
            with ops.blocking():
                return [ops.reducescatter_async(arrays[0], base, op, prescale_factor, postscale_factor,
                                                outputs.allocator(0), process_set=process_set).wait()]

        outs = _call(compute, xs, [x.dtype for x in xs], "HorovodReducescatter")
        outs = [_set_shape(o, _rows_shape(x.shape, _scatter_rows(x.shape, process_set))) for o, x in zip(outs, xs)]

        def grad(*dys):
            return _reducescatter_grads(_zeros_for_none(dys, outs), xs, op, prescale_factor, postscale_factor,
                                        ignore_name_scope, process_set)

        return outs, grad

    return list(_apply(fwd, *tensors)) if tensors else []


@_no_autograph
def _reducescatter(tensor, name: Optional[str] = None, op: ReduceOp = Sum, ignore_name_scope: bool = False,
                   process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                   postscale_factor: float = 1.0) -> tf.Tensor:
    """Upstream's ``mpi_ops._reducescatter`` (op Sum by default): reduce, keep this rank's block; differentiable."""
    return _reducescatter_many([tensor], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                               process_set, grouped=False)[0]


@_no_autograph
def _grouped_reducescatter(tensors, name: Optional[str] = None, op: ReduceOp = Sum, ignore_name_scope: bool = False,
                           process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """Upstream's ``mpi_ops._grouped_reducescatter`` (op Sum by default); differentiable."""
    return _reducescatter_many(list(tensors), name, op, prescale_factor, postscale_factor, ignore_name_scope,
                               process_set, grouped=True)


# ---------------------------------------------------------------------------------------------- control
@_no_autograph
def join(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Mark this rank as done; returns (an int32 scalar tensor) the last rank (of ``process_set``) to join, a
    global rank, the same on every rank.

    While joined, this rank contributes zeros to the other ranks' allreduces.
    """
    def compute(outputs):
        return [np.asarray(ops.join_async(process_set).wait(), np.int32)]

    return _set_shape(_call(compute, [], [tf.int32], "HorovodJoin")[0], [])
