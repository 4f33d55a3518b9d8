"""``horovod.tensorflow`` collectives on TF tensors, eager and inside ``tf.function``, with upstream's gradients.

Eagerly, a collective hands ``np.asarray(tensor)`` (a view of CPU tensors' memory) to the op layer and wraps the
result in a tensor. Inside ``tf.function`` the same Python body runs at execution time through
``tf.numpy_function`` (stateful, so TF neither prunes nor merges it, and automatic control dependencies keep
the collectives of one function in program order on every rank); output shapes are set where they are known.

Tensor names, which every rank must submit in the same order:

- a user ``name`` gives ``<op>.<name>`` (with the current name scope in front unless ``ignore_name_scope``);
- eagerly, an unnamed op gets ``<op>.noname.<n>`` from the process-wide counter (as ``horovod.torch``);
- in a graph, an unnamed op gets ``<op>.<graph-unique node name>`` (``allreduce.HorovodAllreduce_2``), fixed
  at trace time and independent of how often each rank happened to retrace.

Gradients follow upstream: allreduce -> allreduce of the gradient with the same op and scale factors;
allgather -> the gradient averaged across ranks, then this rank's rows; broadcast -> the gradient averaged,
zero on non-root ranks; alltoall -> alltoall of the gradient with the received splits; reducescatter ->
allgather of the gradient, scaled like the forward.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.common import basics, ops
from horovod.common import types as _types
from horovod.common.basics import (  # noqa: F401  (re-exported)
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from horovod.common.exceptions import HorovodInternalError  # noqa: F401
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.types import Adasum, Average, Max, Min, Product, ReduceOp, Sum  # noqa: F401
from horovod.common.util import get_average_backwards_compatibility_fun, num_rank_is_power_2

try:
    from tensorflow.python.eager.record import could_possibly_record as _could_possibly_record
except ImportError:  # pragma: no cover - older or newer TF without the private helper: always record
    def _could_possibly_record() -> bool:
        return True

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_types)

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
        raise ValueError(f"Tensor type {tensor.dtype.name} is not supported by {what}. Supported types: {names}. "
                         "Cast the tensor (for example tf.cast(t, tf.float32)) before the collective.")


def _tensor(value, allowed: set, what: str) -> tf.Tensor:
    if isinstance(value, tf.IndexedSlices):
        raise ValueError(f"{what} does not take tf.IndexedSlices; use allreduce, or tf.convert_to_tensor first.")
    tensor = tf.convert_to_tensor(value)
    _check(tensor, allowed, what)
    return tensor


def _name(op: str, name: Optional[str], ignore_name_scope: bool = False) -> str:
    """The negotiated tensor name (see the module docstring)."""
    if name:
        scope = "" if ignore_name_scope else tf.get_current_name_scope()
        return f"{op}.{scope}/{name}" if scope else f"{op}.{name}"
    if tf.executing_eagerly():
        return ops.tensor_name(op, None)
    node = "Horovod" + "".join(part.capitalize() for part in op.split("_"))
    return f"{op}.{tf.compat.v1.get_default_graph().unique_name(node)}"


def _array(value) -> np.ndarray:
    """A C-contiguous numpy array of an eager tensor or of a numpy input. ``np.asarray`` of a CPU eager tensor is
    a read-only view of its memory (``tensor.numpy()`` copies in TF 2.21: 35 ms for 64 MB). Some tensors (seen
    with bfloat16) refuse ``__array__``; those are copied."""
    try:
        arr = np.asarray(value)
    except ValueError:
        arr = np.asarray(value.numpy())
    return arr if arr.flags.c_contiguous else arr.copy()   # np.ascontiguousarray would turn 0-d into 1-d


_ALIGN = 64                   # TF's EIGEN_MAX_ALIGN_BYTES: tensors wrapping foreign memory must be this aligned
_DLPACK_MIN_BYTES = 1 << 16   # below this a copy is cheaper than the DLPack round trip


def _aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _to_tensor(arr: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """An eager tensor of ``arr``: zero-copy (DLPack) for large 64-byte-aligned arrays, else a copy."""
    if (arr.nbytes >= _DLPACK_MIN_BYTES and arr.flags.c_contiguous and arr.ctypes.data % _ALIGN == 0
            and arr.dtype == dtype.as_numpy_dtype and dtype != tf.bfloat16):
        try:
            return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
        except Exception:  # a dtype DLPack cannot carry: fall back to the copy
            pass
    return tf.convert_to_tensor(arr, dtype=dtype)


def _call(compute: Callable[..., List[np.ndarray]], inputs: Sequence[tf.Tensor], tout: Sequence[tf.DType],
          node: str) -> List[tf.Tensor]:
    """Run ``compute`` (numpy arrays -> list of numpy arrays) now when eager, at execution time in a graph."""
    if tf.executing_eagerly():
        results = compute(*[_array(t) for t in inputs])
        return [_to_tensor(np.asarray(r), d) for r, d in zip(results, tout)]

    def body(*arrays):
        results = compute(*[_array(a) for a in arrays])
        return [np.asarray(r, dtype=d.as_numpy_dtype) for r, d in zip(results, tout)]

    outs = _chained_numpy_function(body, list(inputs), list(tout), node)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _chained_numpy_function(body, inputs, tout, node):
    """``tf.numpy_function`` with a control dependency on the previous collective of the same graph.

    Automatic control dependencies order stateful ops inside a ``tf.function`` body, but not in every graph TF
    builds (the backward function of a ``tf.function`` called under an eager tape has none). Collectives that
    block on an inter-op thread each, in a different order on each rank, can exhaust the thread pool and
    deadlock; chaining them in creation order (a topological order, so no cycle) rules that out.

    Function graphs run every stateful op on each call, so the chain adds no work there. A TF1 ``tf.Graph`` runs
    only what a ``session.run`` fetch needs: there a chain over the whole graph would make, say, the variable
    broadcast run (and need the feeds of) the gradient allreduce built before it. So in a TF1 graph only the
    collectives built inside one :func:`collective_chain` block (one optimizer step's allreduces) are chained.
    """
    graph = tf.compat.v1.get_default_graph()
    chained = getattr(graph, "building_function", False) or getattr(graph, "_horovod_chain_depth", 0) > 0
    previous = getattr(graph, "_horovod_last_collective", None) if chained else None
    with tf.control_dependencies([previous] if previous is not None else []):
        outs = tf.numpy_function(body, inputs, tout, stateful=True, name=node)
    first = outs[0] if isinstance(outs, (list, tuple)) else outs
    if chained:
        graph._horovod_last_collective = first.op
    return outs


@contextlib.contextmanager
def collective_chain() -> Iterator[None]:
    """Chain the collectives built inside this block in creation order, in a TF1 graph too (a fresh chain that
    does not depend on collectives built before the block); a no-op eagerly and in function graphs, which are
    always chained."""
    if tf.executing_eagerly():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "building_function", False):
        yield
        return
    depth = getattr(graph, "_horovod_chain_depth", 0)
    graph._horovod_chain_depth = depth + 1
    if depth == 0:
        graph._horovod_last_collective = None
    try:
        yield
    finally:
        graph._horovod_chain_depth = depth
        if depth == 0:
            graph._horovod_last_collective = None


def _apply(fwd: Callable, *tensors):
    """``fwd`` returns (outputs, grad_fn): register the gradient with tf.custom_gradient, except eagerly when no
    tape is recording (custom_gradient costs about as much Python time as a small collective itself)."""
    if tf.executing_eagerly() and not _could_possibly_record():
        return fwd(*tensors)[0]
    return tf.custom_gradient(fwd)(*tensors)


def _wait_all(handle) -> List[np.ndarray]:
    """A grouped op's results as a list (the op layer returns a lone array for a group of one)."""
    result = handle.wait()
    return result if isinstance(result, list) else [result]


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
def _scalar_op(value_fn: Callable[[], int], name: Optional[str], collective: bool = False) -> tf.Tensor:
    if tf.executing_eagerly():
        return tf.constant(value_fn(), dtype=tf.int32)
    if collective:
        out = _chained_numpy_function(lambda: np.int32(value_fn()), [], tf.int32, name)
    else:
        out = tf.numpy_function(lambda: np.int32(value_fn()), [], tf.int32, stateful=True, name=name or "HorovodSize")
    out.set_shape([])
    return out


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with the number of ranks, read when the op runs (not when it is traced)."""
    return _scalar_op(basics.size, name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with the number of ranks on this host."""
    return _scalar_op(basics.local_size, name)


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with this process's rank."""
    return _scalar_op(basics.rank, name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar with this process's rank on its host."""
    return _scalar_op(basics.local_rank, name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An int32 scalar: 1 if this rank belongs to the process set (only the global set exists: always 1)."""
    if process_set_id != 0:
        raise NotImplementedError("only the global process set is available in this release")
    return _scalar_op(lambda: 1, name)


# ---------------------------------------------------------------------------------------------- allreduce
def _allreduce(tensor, name: Optional[str] = None, op: ReduceOp = Sum, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Differentiable allreduce of one dense tensor (the op layer's op; Average divides by the set size)."""
    tensor = _tensor(tensor, _REDUCE_DTYPES, "allreduce")
    if ReduceOp(op) == Adasum:
        raise NotImplementedError("The Adasum reduction is not available in this release yet; use op=Average or Sum.")
    full = _name("allreduce", name, ignore_name_scope)

    def fwd(x):
        def compute(a):
            out = _aligned_empty(a.shape, a.dtype)
            return [ops.allreduce_async(a, out, full, op, prescale_factor, postscale_factor, process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodAllreduce")[0], x.shape)

        def grad(dy):
            return _allreduce(dy, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                              ignore_name_scope=ignore_name_scope, process_set=process_set)

        return out, grad

    return _apply(fwd, tensor)


def _grouped_allreduce(tensors, name: Optional[str] = None, op: ReduceOp = Sum, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    tensors = [_tensor(t, _REDUCE_DTYPES, "grouped_allreduce") for t in tensors]
    if not tensors:
        return []
    if ReduceOp(op) == Adasum:
        raise NotImplementedError("The Adasum reduction is not available in this release yet; use op=Average or Sum.")
    base = _name("grouped_allreduce", name, ignore_name_scope)

    def fwd(*xs):
        def compute(*arrays):
            outs = [_aligned_empty(a.shape, a.dtype) for a in arrays]
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
    """Backward of (grouped) allgather in one callback: average each gradient, keep this rank's rows."""
    def compute(*arrays):
        n = len(arrays) // 2
        grads, dims = arrays[:n], arrays[n:]
        reduced = [ops.allreduce_async(g, None, nm, Average, process_set=process_set) for g, nm in zip(grads, names)]
        gathered = [ops.allgather_async(np.asarray(d, np.int64).reshape(1), dn, process_set=process_set)
                    for d, dn in zip(dims, dims_names)]
        outs = []
        for r, g in zip(reduced, gathered):
            full, all_dims = r.wait(), g.wait()
            offset = int(all_dims[:rank_].sum())
            outs.append(full[offset:offset + int(all_dims[rank_])].copy())
        return outs
    return compute


def _allgather_grads(dys, xs, ignore_name_scope, process_set):
    names = [_name("allreduce", None, ignore_name_scope) for _ in dys]
    dims_names = [_name("allgather", None, ignore_name_scope) for _ in dys]
    dims = [tf.shape(x, out_type=tf.int64)[0] for x in xs]
    outs = _call(_gather_grad_compute(rank(), names, dims_names, process_set), [*dys, *dims],
                 [x.dtype for x in xs], "HorovodAllgatherGrad")
    return [_set_shape(o, x.shape) for o, x in zip(outs, xs)]


def allgather(tensor, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks); differentiable."""
    tensor = _tensor(tensor, _MOVE_DTYPES, "allgather")
    if tensor.shape.rank == 0:
        raise ValueError("allgather needs a tensor with at least one dimension; reshape scalars to shape [1].")
    full = _name("allgather", name, ignore_name_scope)

    def fwd(x):
        def compute(a):
            return [ops.allgather_async(a, full, _aligned_empty, process_set=process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodAllgather")[0], _rows_shape(x.shape))

        def grad(dy):
            return _allgather_grads([dy], [x], ignore_name_scope, process_set)[0]

        return out, grad

    return _apply(fwd, tensor)


def grouped_allgather(tensors, name: Optional[str] = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgather each tensor of a list, negotiated as one unit; differentiable."""
    tensors = [_tensor(t, _MOVE_DTYPES, "grouped_allgather") for t in tensors]
    if not tensors:
        return []
    if any(t.shape.rank == 0 for t in tensors):
        raise ValueError("allgather needs tensors with at least one dimension.")
    base = _name("grouped_allgather", name, ignore_name_scope)

    def fwd(*xs):
        def compute(*arrays):
            return _wait_all(ops.grouped_allgather_async(list(arrays), base, _aligned_empty, process_set=process_set))

        outs = _call(compute, xs, [x.dtype for x in xs], "HorovodGroupedAllgather")
        outs = [_set_shape(o, _rows_shape(x.shape)) for o, x in zip(outs, xs)]

        def grad(*dys):
            return _allgather_grads(_zeros_for_none(dys, outs), xs, ignore_name_scope, process_set)

        return outs, grad

    return list(_apply(fwd, *tensors))


# ---------------------------------------------------------------------------------------------- broadcast
def broadcast(tensor, root_rank: int, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` (a global rank) on every rank; differentiable."""
    tensor = _tensor(tensor, _MOVE_DTYPES, "broadcast")
    full = _name("broadcast", name, ignore_name_scope)
    root_rank = int(root_rank)

    def fwd(x):
        def compute(a):
            out = _aligned_empty(a.shape, a.dtype)
            return [ops.broadcast_async(a, root_rank, out, full, process_set).wait()]

        out = _set_shape(_call(compute, [x], [x.dtype], "HorovodBroadcast")[0], x.shape)

        def grad(dy):
            reduced = _allreduce(dy, op=Average, ignore_name_scope=ignore_name_scope, process_set=process_set)
            return reduced if rank() == root_rank else reduced * 0

        return out, grad

    return _apply(fwd, tensor)


def _broadcast_many(tensors: List[tf.Tensor], root_rank: int, base: str, process_set) -> List[tf.Tensor]:
    """Broadcast several tensors in one callback (all started, then awaited: the engine fuses them)."""
    names = [f"{base}.{i}" for i in range(len(tensors))]

    def compute(*arrays):
        handles = [ops.broadcast_async(a, root_rank, None, n, process_set) for a, n in zip(arrays, names)]
        return [h.wait() for h in handles]

    outs = _call(compute, tensors, [t.dtype for t in tensors], "HorovodBroadcastInplace")
    return [_set_shape(o, t.shape) for o, t in zip(outs, tensors)]


def broadcast_(variables, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set):
    """Overwrite each variable with ``root_rank``'s value; returns the variables' new values."""
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    if not variables:
        return []
    values = [_tensor(v.read_value() if hasattr(v, "read_value") else v, _MOVE_DTYPES, "broadcast_")
              for v in variables]
    outs = _broadcast_many(values, int(root_rank), _name("broadcast_", name), process_set)
    return [v.assign(o) for v, o in zip(variables, outs)]


# ---------------------------------------------------------------------------------------------- alltoall
def alltoall(tensor, splits=None, name: Optional[str] = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[j]`` rows to rank j (dim 0 split equally without splits); returns
    ``(output, received_splits)``; differentiable in ``tensor``."""
    tensor = _tensor(tensor, _MOVE_DTYPES, "alltoall")
    if tensor.shape.rank == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension.")
    splits_t = (tf.zeros([0], tf.int32) if splits is None
                else tf.cast(tf.reshape(tf.convert_to_tensor(splits), [-1]), tf.int32))
    full = _name("alltoall", name, ignore_name_scope)
    n = size()

    def fwd(x, s):
        def compute(a, sp):
            out, received = ops.alltoall_async(a, None if sp.size == 0 else sp.tolist(), full,
                                               process_set=process_set).wait()
            return [out, np.asarray(received, np.int32)]

        out, received = _call(compute, [x, s], [x.dtype, tf.int32], "HorovodAlltoall")
        out = _set_shape(out, _rows_shape(x.shape))
        received = _set_shape(received, [n])

        def grad(dy, _dreceived):
            back, _ = alltoall(dy, received, ignore_name_scope=ignore_name_scope, process_set=process_set)
            return back, None

        return (out, received), grad

    out, received = _apply(fwd, tensor, splits_t)
    return out, received


# ---------------------------------------------------------------------------------------------- reducescatter
def _scatter_rows(shape: tf.TensorShape):
    if shape.rank is None or shape[0] is None:
        return None
    n, r = size(), rank()
    return shape[0] // n + (1 if r < shape[0] % n else 0)


def _reducescatter_grads(dys, xs, op, scale, ignore_name_scope, process_set):
    factor = scale / (size() if ReduceOp(op) == Average else 1)
    base = _name("grouped_allgather", None, ignore_name_scope)

    def compute(*arrays):
        return _wait_all(ops.grouped_allgather_async(list(arrays), base, process_set=process_set))

    outs = _call(compute, dys, [d.dtype for d in dys], "HorovodReducescatterGrad")
    outs = [_set_shape(o, x.shape) for o, x in zip(outs, xs)]
    return [o * tf.cast(factor, o.dtype) if factor != 1 else o for o in outs]


def _reducescatter(tensors, name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set,
                   grouped: bool):
    what = "grouped_reducescatter" if grouped else "reducescatter"
    tensors = [_tensor(t, _REDUCE_DTYPES, what) for t in tensors]
    op = ReduceOp(op)
    if op not in (Sum, Average):
        raise ValueError(f"reducescatter supports op=Sum and op=Average, not {op.name.capitalize()}.")
    if any(t.shape.rank == 0 for t in tensors):
        raise ValueError("reducescatter needs tensors with at least one dimension.")
    base = _name(what, name, ignore_name_scope)

    def fwd(*xs):
        def compute(*arrays):
            if grouped:
                return _wait_all(ops.grouped_reducescatter_async(list(arrays), base, op, prescale_factor,
                                                                 postscale_factor, process_set=process_set))
            return [ops.reducescatter_async(arrays[0], base, op, prescale_factor, postscale_factor,
                                            _aligned_empty, process_set=process_set).wait()]

        outs = _call(compute, xs, [x.dtype for x in xs], "HorovodReducescatter")
        outs = [_set_shape(o, _rows_shape(x.shape, _scatter_rows(x.shape))) for o, x in zip(outs, xs)]

        def grad(*dys):
            return _reducescatter_grads(_zeros_for_none(dys, outs), xs, op, prescale_factor * postscale_factor,
                                        ignore_name_scope, process_set)

        return outs, grad

    return list(_apply(fwd, *tensors)) if tensors else []


# ---------------------------------------------------------------------------------------------- control
def join() -> tf.Tensor:
    """Mark this rank as done; returns (an int32 scalar tensor) the last rank to join, the same on every rank.

    While joined, this rank contributes zeros to the other ranks' allreduces.
    """
    return _scalar_op(lambda: ops.join_async().wait(), "HorovodJoin", collective=True)
