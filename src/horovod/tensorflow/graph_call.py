"""Where a collective's Python body runs, so that no program can deadlock whatever TensorFlow's scheduler does.

A body is ``compute(outputs, *arrays) -> [arrays]``: it enqueues to the op layer and waits for the handle.

- **Eagerly** it runs at once on the caller's numpy views; op-layer errors are raised as ``tf.errors`` classes
  (see ``horovod.tensorflow.errors``).
- **In a function graph** (``tf.function``) it becomes a ``HorovodCollective`` node (``kernel.py``). The
  collectives of one function are chained by control dependencies in creation order, so every rank runs them
  one at a time in the same order: a blocked kernel never waits for a collective that its rank has not started.
- **In a TF1 graph** a ``session.run`` may fetch any number of independent collectives, and TensorFlow starts them
  in any order on each rank. A kernel that blocks an inter-op thread while it waits could then deadlock: with two
  threads, rank 0 may wait in A and B while rank 1 waits in C and D. (A polling ``tf.while_loop`` does not help:
  the executor runs a loop's next iteration before other queued work on the same thread, so with one thread the
  first loop never lets the other collectives start.) So the node runs inside a one-element ``tf.data`` map made
  with ``use_inter_op_parallelism=False``: ``DatasetToSingleElement`` is an asynchronous kernel that runs the
  map on a thread of tf.data's unbounded pool, and the single-threaded function executor runs our kernel on that
  very thread. A waiting collective holds no inter-op thread, however many one run fetches and whatever the
  ``inter_op_parallelism_threads``. The wait itself is a plain blocking ``Handle.wait`` (no polling).

The collectives built inside :func:`collective_chain` (one optimizer step's allreduces) are also chained in a TF1
graph, so that they run in one order on every rank.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.core.engine.handles import several_threads
from horovod.tensorflow import kernel
from horovod.tensorflow.errors import translate

logger = logging.getLogger(__name__)

Compute = Callable[..., List[np.ndarray]]

try:   # the map dataset class with the use_inter_op_parallelism switch (TF >= 2.12; dataset_ops before)
    from tensorflow.python.data.ops.map_op import _MapDataset
except ImportError:  # pragma: no cover - older TensorFlow
    try:
        from tensorflow.python.data.ops.dataset_ops import MapDataset as _MapDataset
    except ImportError:
        _MapDataset = None

_DLPACK_MIN_BYTES = kernel.ALIGNED_FROM   # below this a copy is cheaper than the DLPack round trip


def _array(value) -> np.ndarray:
    """A C-contiguous numpy array of an eager tensor or of a numpy input. ``np.asarray`` of a CPU eager tensor is
    a read-only view of its memory (``tensor.numpy()`` copies in TF 2.21: 35 ms for 64 MB). Some tensors (seen
    with bfloat16) refuse ``__array__``; those are copied."""
    try:
        arr = np.asarray(value)
    except ValueError:
        arr = np.asarray(value.numpy())
    return arr if arr.flags.c_contiguous else arr.copy()   # np.ascontiguousarray would turn 0-d into 1-d


def _to_tensor(arr: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """An eager tensor of ``arr``: zero-copy (DLPack) for large 64-byte-aligned arrays, else a copy."""
    if (arr.nbytes >= _DLPACK_MIN_BYTES and arr.flags.c_contiguous and arr.ctypes.data % kernel.ALIGN == 0
            and arr.dtype == dtype.as_numpy_dtype and dtype != tf.bfloat16):
        try:
            return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
        except Exception:  # a dtype DLPack cannot carry: fall back to the copy
            pass
    return tf.constant(arr, dtype=dtype)    # half of tf.convert_to_tensor's time (4 KB: 10.8 against 21.7 µs)


def run_eagerly(compute: Compute, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    """``compute`` on numpy arrays now, with op-layer errors raised as their ``tf.errors`` classes."""
    try:
        return compute(kernel.EagerOutputs(), *arrays)
    except Exception as exc:
        translated = translate(exc)
        if translated is exc:
            raise
        raise translated from None


def call(compute: Compute, inputs: Sequence[tf.Tensor], tout: Sequence[tf.DType], node: str) -> List[tf.Tensor]:
    """Run ``compute`` now when eager, else add it to the current graph (see the module docstring)."""
    if tf.executing_eagerly():
        results = run_eagerly(compute, [_array(t) for t in inputs])
        return [_to_tensor(np.asarray(r), d) for r, d in zip(results, tout)]
    graph = tf.compat.v1.get_default_graph()
    in_function = getattr(graph, "building_function", False)
    chained = _chained(graph)
    previous = chain_last(graph)
    # The op has a CPU kernel only, and tf.data has no GPU kernels: place them on the CPU explicitly (a session
    # without soft placement would refuse a GPU device scope); inputs on a GPU are copied to host memory.
    with tf.control_dependencies([previous] if previous is not None else []), tf.device("/cpu:0"):
        if in_function or _MapDataset is None:
            outs = _node(compute, list(inputs), list(tout), node)
        else:
            outs = _off_inter_op_pool(compute, list(inputs), list(tout), node)
    if chained:
        set_chain_last(graph, outs[0].op)
    return outs


def _chained(graph) -> bool:
    return bool(getattr(graph, "building_function", False)) or getattr(graph, "_horovod_chain_depth", 0) > 0


def chain_last(graph) -> Optional[tf.Operation]:
    """The last collective chained in ``graph`` (the next one must depend on it), or None."""
    return getattr(graph, "_horovod_last_collective", None) if _chained(graph) else None


def set_chain_last(graph, op: tf.Operation) -> None:
    """Make ``op`` the end of ``graph``'s chain of collectives (where the chain applies)."""
    if _chained(graph):
        graph._horovod_last_collective = op


def _node(compute: Compute, inputs: List[tf.Tensor], tout: List[tf.DType], node: str) -> List[tf.Tensor]:
    """The graph node that runs ``compute``: a HorovodCollective op, or a numpy_function where the C API is
    missing."""
    if kernel.available():
        return kernel.collective_op(compute, inputs, tout, node)

    def body(*arrays):
        results = compute(kernel.EagerOutputs(), *[_array(a) for a in arrays])
        return [np.asarray(r, dtype=d.as_numpy_dtype) for r, d in zip(results, tout)]

    outs = tf.numpy_function(body, inputs, tout, stateful=True, name=node)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _off_inter_op_pool(compute: Compute, inputs: List[tf.Tensor], tout: List[tf.DType],
                       node: str) -> List[tf.Tensor]:
    """``_node`` inside a one-element tf.data map run by tf.data's own threads (see the module docstring)."""
    components = tuple(inputs) if inputs else (tf.zeros([0], tf.int8),)   # a dataset needs one component

    def threaded(outputs, *arrays):
        # TensorFlow runs a session's independent collectives on as many threads: the deadlock detector then only
        # reports a crossed wait on this rank (another thread may still submit), it does not end the job.
        with several_threads():
            return compute(outputs, *arrays)

    @tf.autograph.experimental.do_not_convert
    def apply(*tensors):
        return tuple(_node(threaded, list(tensors) if inputs else [], tout, node))

    with tf.name_scope(node):
        dataset = _MapDataset(tf.data.Dataset.from_tensors(components), apply, use_inter_op_parallelism=False)
        return list(dataset.get_single_element())


@contextlib.contextmanager
def collective_chain() -> Iterator[None]:
    """Chain the collectives built inside this block in creation order, in a TF1 graph too (a fresh chain that
    does not depend on collectives built before the block); a no-op eagerly and in function graphs, which are
    always chained.

    Function graphs run every stateful op on each call, so the chain adds no work there. A TF1 ``tf.Graph`` runs
    only what a ``session.run`` fetch needs: there a chain over the whole graph would make, say, the variable
    broadcast run (and need the feeds of) the gradient allreduce built before it; hence chains only inside
    this block.
    """
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
