"""``HorovodCollective``: a TensorFlow op whose CPU kernel is a Python function, registered through TensorFlow's C
API (``tensorflow/c/ops.h`` and ``kernels.h``, exported by ``libtensorflow_framework``) with ctypes, so no compiler
is needed.

Why not ``tf.numpy_function``: a Python exception inside a numpy_function becomes ``InvalidArgumentError``
(ValueError, TypeError), ``UnimplementedError``, ``ResourceExhaustedError``, ``OutOfRangeError`` or else
``UnknownError``; a kernel of our own can fail with any status, so a cross-rank mismatch is a
``FailedPreconditionError`` in graphs as upstream's kernels make it. The kernel also reads its inputs and writes
its outputs in place (TensorFlow's own buffers), where a numpy_function converts them.

A node carries an integer ``token`` attribute naming its Python body in a registry; the body lives as long as the
outermost graph that holds the node (as numpy_function's do). The body gets numpy views of the inputs and an
:class:`Outputs` object that hands out output buffers allocated by TensorFlow (callable from any thread until the
body returns, so the engine can allocate an allgather's output once the size is negotiated); it returns the
output arrays, and results that are not those buffers are copied in.

The kernel is synchronous: it holds the thread it runs on until the body returns. ``graph_call`` decides where
that thread comes from.
"""
from __future__ import annotations

import ctypes
import glob
import itertools
import logging
import math
import os
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.tensorflow.errors import status_of

logger = logging.getLogger(__name__)

OP_TYPE = "HorovodCollective"
# The same kernel under a second op type that tf.function does not order after the function's other stateful
# ops (see ``unordered``): for a node that only starts an operation and never waits.
UNORDERED_OP_TYPE = "HorovodCollectiveUnordered"
OP_TYPES = (OP_TYPE, UNORDERED_OP_TYPE)
Body = Callable[..., List[np.ndarray]]

_P = ctypes.c_void_p
_CREATE = ctypes.CFUNCTYPE(_P, _P)
_COMPUTE = ctypes.CFUNCTYPE(None, _P, _P)
_TF_OK = 0
_TF_INTERNAL = 13

_bodies: Dict[int, Body] = {}
_tokens = itertools.count(1)
_dtypes: Dict[int, np.dtype] = {}


class _CApi:
    """The C functions the kernel uses, with their signatures."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        def fn(name, restype, *argtypes):
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, list(argtypes)
            return f

        c_int, c_str, i64 = ctypes.c_int, ctypes.c_char_p, ctypes.c_int64
        self.new_status = fn("TF_NewStatus", _P)
        self.delete_status = fn("TF_DeleteStatus", None, _P)
        self.set_status = fn("TF_SetStatus", None, _P, c_int, c_str)
        self.get_code = fn("TF_GetCode", c_int, _P)
        self.message = fn("TF_Message", c_str, _P)
        self.new_op = fn("TF_NewOpDefinitionBuilder", _P, c_str)
        self.add_attr = fn("TF_OpDefinitionBuilderAddAttr", None, _P, c_str)
        self.add_input = fn("TF_OpDefinitionBuilderAddInput", None, _P, c_str)
        self.add_output = fn("TF_OpDefinitionBuilderAddOutput", None, _P, c_str)
        self.set_stateful = fn("TF_OpDefinitionBuilderSetIsStateful", None, _P, ctypes.c_bool)
        self.register_op = fn("TF_RegisterOpDefinition", None, _P, _P)
        self.new_kernel = fn("TF_NewKernelBuilder", _P, c_str, c_str, _CREATE, _COMPUTE, _P)
        self.register_kernel = fn("TF_RegisterKernelBuilder", None, c_str, _P, _P)
        self.attr_int64 = fn("TF_OpKernelConstruction_GetAttrInt64", None, _P, c_str, ctypes.POINTER(i64), _P)
        self.num_inputs = fn("TF_NumInputs", c_int, _P)
        self.get_input = fn("TF_GetInput", None, _P, c_int, ctypes.POINTER(_P), _P)
        self.data = fn("TF_TensorData", _P, _P)
        self.dtype = fn("TF_TensorType", c_int, _P)
        self.num_dims = fn("TF_NumDims", c_int, _P)
        self.dim = fn("TF_Dim", i64, _P, c_int)
        self.byte_size = fn("TF_TensorByteSize", ctypes.c_size_t, _P)
        self.delete_tensor = fn("TF_DeleteTensor", None, _P)
        self.allocate = fn("TF_AllocateOutput", _P, _P, c_int, c_int, ctypes.POINTER(i64), c_int, ctypes.c_size_t, _P)
        self.output_dtype = fn("TF_ExpectedOutputDataType", c_int, _P, c_int)
        self.fail = fn("TF_OpKernelContext_Failure", None, _P, _P)


def _np_dtype(enum: int) -> np.dtype:
    dtype = _dtypes.get(enum)
    if dtype is None:
        dtype = _dtypes[enum] = np.dtype(tf.dtypes.as_dtype(enum).as_numpy_dtype)
    return dtype


def _view(api: _CApi, tensor: int, dtype: np.dtype, shape: tuple, nbytes: int) -> np.ndarray:
    """A numpy array over a TF_Tensor's buffer (valid while the tensor is)."""
    if nbytes == 0:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * nbytes).from_address(api.data(tensor))
    return np.frombuffer(buffer, dtype).reshape(shape)


class Outputs:
    """Output buffers of the running kernel, allocated by TensorFlow (zero-copy results).

    ``empty(i, shape, dtype)`` may be called once per output, from any thread, until the body returns.
    ``keep()`` lets a body that returns before the engine is done with its buffers keep them alive.
    """

    def __init__(self, api: _CApi, ctx: int) -> None:
        self._api, self._ctx = api, ctx
        self._lock = threading.Lock()
        self.buffers: Dict[int, np.ndarray] = {}
        self._tensors: List[int] = []
        self.closed = False
        self.lease: Optional[Lease] = None

    def empty(self, index: int, shape, dtype) -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        with self._lock:
            if self.closed or index in self.buffers:
                return _aligned_empty(shape, dtype)
            api = self._api
            tf_dtype = api.output_dtype(self._ctx, index)
            if _np_dtype(tf_dtype) != dtype:
                return _aligned_empty(shape, dtype)
            nbytes = math.prod(shape) * dtype.itemsize       # (np.prod: 3 µs of a small call)
            dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            status = api.new_status()
            try:
                tensor = api.allocate(self._ctx, index, tf_dtype, dims, len(shape), nbytes, status)
                if api.get_code(status) != _TF_OK:
                    raise MemoryError(f"TensorFlow could not allocate output {index} {shape} {dtype}: "
                                      f"{api.message(status).decode(errors='replace')}")
            finally:
                api.delete_status(status)
            self._tensors.append(tensor)
            arr = _view(api, tensor, dtype, shape, nbytes)
            self.buffers[index] = arr
            return arr

    def allocator(self, index: int) -> Callable[[tuple, np.dtype], np.ndarray]:
        """An allocator (shape, dtype) -> array for output ``index``, for the engine to call."""
        return lambda shape, dtype: self.empty(index, shape, dtype)

    def keep(self) -> Lease:
        """Keep this kernel's input and output buffers alive after the body returns, until the returned lease is
        released: for a body that starts an operation reading the inputs and writing the outputs and returns
        before it finished (TensorFlow frees or reuses a buffer nobody holds)."""
        with self._lock:
            if self.lease is None:
                self.lease = Lease(self._api)
            return self.lease

    def close(self, inputs: Sequence[int] = ()) -> None:
        """The body returned: drop this kernel's references to its output (and ``inputs``) buffers, or hand
        them to the lease."""
        with self._lock:
            self.closed = True
            tensors = [*self._tensors, *inputs]
            self._tensors.clear()
            if self.lease is not None:
                self.lease.adopt(tensors)
                return
            for tensor in tensors:
                self._api.delete_tensor(tensor)


class Lease:
    """TensorFlow buffers a kernel keeps after it returned (see :meth:`Outputs.keep`); ``release`` (once, from
    any thread) lets TensorFlow free them."""

    def __init__(self, api: _CApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._tensors: List[int] = []
        self._released = False

    def adopt(self, tensors: Sequence[int]) -> None:
        with self._lock:
            if not self._released:
                self._tensors.extend(tensors)
                return
        for tensor in tensors:
            self._api.delete_tensor(tensor)

    def release(self) -> None:
        with self._lock:
            self._released = True
            tensors, self._tensors = self._tensors, []
        for tensor in tensors:
            self._api.delete_tensor(tensor)


class EagerOutputs:
    """The same interface outside a kernel: fresh arrays, 64-byte-aligned from ``ALIGNED_FROM`` bytes (where a
    result becomes a tensor through DLPack without a copy; below, it is copied, and aligning a small array cost
    more than the rest of a 4 KB eager allreduce's Python: 5.5 µs for ``ctypes.data`` and the slicing)."""

    def empty(self, index: int, shape, dtype) -> np.ndarray:
        return _eager_empty(tuple(int(d) for d in shape), dtype)

    def allocator(self, index: int) -> Callable[[tuple, np.dtype], np.ndarray]:
        return _eager_empty


ALIGNED_FROM = 1 << 16      # graph_call's DLPack threshold: smaller results are copied into their tensors


def _eager_empty(shape, dtype) -> np.ndarray:
    """An eager result's array: aligned (:func:`_aligned_empty`) where DLPack may take it, else ``np.empty``."""
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < ALIGNED_FROM:
        return np.empty(shape, dtype)
    return _aligned_empty(shape, dtype)


ALIGN = 64   # TF's EIGEN_MAX_ALIGN_BYTES: tensors wrapping foreign memory must be this aligned


def _aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (a is b or (a.shape == b.shape and a.dtype == b.dtype and a.size > 0
                       and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]))


_THREAD = threading.local()


def _keep_thread_state() -> None:
    """Keep the Python thread state of the TensorFlow thread this kernel runs on, from its first call on.

    A ctypes callback on a thread that Python did not start makes a thread state on entry and destroys it on
    return (``PyGILState_Ensure``/``Release``), so every call paid for a new one, and found every thread-local
    (the op layer's, the engine's) empty: 51 µs of a 4 KB allreduce inside a ``tf.function`` (218 -> 167 µs, 2
    ranks; a ``tf.function`` of one multiply takes 95 µs here). One more ``PyGILState_Ensure``, never released,
    keeps the state for the thread's life; this thread-local, kept with it, says the thread has one. TensorFlow's
    inter-op and ``tf.data`` threads live as long as their pools: a pool's thread that exits leaves its state
    (a few KB) behind."""
    if not getattr(_THREAD, "kept", False):
        ctypes.pythonapi.PyGILState_Ensure()
        _THREAD.kept = True


def _fail(api: _CApi, ctx: int, code: int, message: str) -> None:
    status = api.new_status()
    api.set_status(status, code, message.encode("utf-8", errors="replace"))
    api.fail(ctx, status)
    api.delete_status(status)


def _run(api: _CApi, token: int, ctx: int) -> None:
    """The kernel body: inputs -> Python body -> outputs, or a failed status."""
    body = _bodies.get(token)
    if body is None:
        _fail(api, ctx, _TF_INTERNAL, f"The Python function of this {OP_TYPE} op is gone (its graph was deleted); "
                                      "rebuild the graph in this process.")
        return
    held: List[int] = []
    outputs = Outputs(api, ctx)
    try:
        arrays = []
        status = api.new_status()
        try:
            for i in range(api.num_inputs(ctx)):
                tensor = _P()
                api.get_input(ctx, i, ctypes.byref(tensor), status)
                if api.get_code(status) != _TF_OK:
                    api.fail(ctx, status)
                    return
                held.append(tensor.value)
                shape = tuple(api.dim(tensor, d) for d in range(api.num_dims(tensor)))
                arr = _view(api, tensor.value, _np_dtype(api.dtype(tensor)), shape, api.byte_size(tensor))
                arr.flags.writeable = False
                arrays.append(arr)
        finally:
            api.delete_status(status)
        results = body(outputs, *arrays)
        for i, result in enumerate(results):
            result = np.asarray(result)
            target = outputs.buffers.get(i)
            if target is None:
                target = outputs.empty(i, result.shape, _np_dtype(api.output_dtype(ctx, i)))
            elif _same_memory(target, result):
                continue                # the engine wrote the result into TensorFlow's buffer
            if target.shape != result.shape:
                raise RuntimeError(f"{OP_TYPE} output {i} was allocated with shape {target.shape} but the result "
                                   f"has shape {result.shape}")
            np.copyto(target, result, casting="unsafe")
    except BaseException as exc:  # every failure must become the op's status
        code, message = status_of(exc)
        _fail(api, ctx, code, message)
    finally:
        outputs.close(held)


class _Kernel:
    """The registered op and kernel (once per process) and the ctypes callbacks that must outlive them."""

    def __init__(self, api: _CApi) -> None:
        self.api = api

        @_CREATE
        def create(construction):
            status = api.new_status()
            token = ctypes.c_int64(0)
            api.attr_int64(construction, b"token", ctypes.byref(token), status)
            api.delete_status(status)
            return token.value

        @_COMPUTE
        def compute(kernel, ctx):
            try:
                _keep_thread_state()
                _run(api, kernel or 0, ctx)
            except BaseException:  # never let an exception escape into TensorFlow's thread
                logger.exception("%s kernel failed", OP_TYPE)

        self._callbacks = (create, compute)
        for op_type in OP_TYPES:
            self._register(op_type.encode(), create, compute)

    def _register(self, op_type: bytes, create, compute) -> None:
        api = self.api
        status = api.new_status()
        try:
            builder = api.new_op(op_type)
            for attr in (b"Tin: list(type) >= 0", b"Tout: list(type) >= 0", b"token: int"):
                api.add_attr(builder, attr)
            api.add_input(builder, b"inputs: Tin")
            api.add_output(builder, b"outputs: Tout")
            api.set_stateful(builder, True)
            api.register_op(builder, status)
            self._check(status, "register the op")
            kernel = api.new_kernel(op_type, b"CPU", create, compute, None)
            api.register_kernel(op_type, kernel, status)
            self._check(status, "register its CPU kernel")
        finally:
            api.delete_status(status)

    def _check(self, status, what: str) -> None:
        if self.api.get_code(status) != _TF_OK:
            raise RuntimeError(f"TensorFlow refused to {what}: {self.api.message(status).decode(errors='replace')}")


def _framework_library() -> str:
    found = sorted(glob.glob(os.path.join(tf.sysconfig.get_lib(), "libtensorflow_framework*")))
    if not found:
        raise OSError(f"no libtensorflow_framework library in {tf.sysconfig.get_lib()}")
    return found[0]


def _load() -> Optional[_Kernel]:
    try:
        from tensorflow.python.framework import op_def_registry

        for op_type in OP_TYPES:
            if op_def_registry.get(op_type) is not None:
                raise RuntimeError(f"an op named {op_type} is already registered in this process")
        kernel = _Kernel(_CApi(ctypes.CDLL(_framework_library())))
        for op_type in OP_TYPES:
            tf.no_gradient(op_type)
        return kernel
    except Exception as exc:  # any failure means: use the numpy_function fallback
        logger.warning("Horovod could not register its TensorFlow op through the C API (%s: %s); inside graphs "
                       "collectives run through tf.numpy_function instead, where a cross-rank mismatch is an "
                       "UnknownError.", type(exc).__name__, exc)
        return None


_KERNEL = _load()


def available() -> bool:
    """True when the ``HorovodCollective`` op is registered (else graphs use tf.numpy_function)."""
    return _KERNEL is not None


def _outermost(graph):
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def _exempt_from_ordering(op_type: str) -> bool:
    """Let tf.function run ``op_type`` nodes as soon as their inputs exist. A function orders every stateful op
    that takes no resource after the one created before it (automatic control dependencies), which would make
    each gradient's start wait for the previous gradient's; op types in TensorFlow's
    ``MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS`` still always run but are not ordered. False where this
    TensorFlow has no such list."""
    try:
        from tensorflow.python.framework import auto_control_deps as acd
    except ImportError:  # pragma: no cover - a TensorFlow without the module
        return False
    types = getattr(acd, "MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS", None)
    if not isinstance(types, frozenset):
        return False
    if op_type not in types:
        acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = types | {op_type}
    return True


_UNORDERED = _KERNEL is not None and _exempt_from_ordering(UNORDERED_OP_TYPE)


def unordered_available() -> bool:
    """True when ``collective_op(..., unordered=True)`` nodes escape tf.function's automatic ordering."""
    return _UNORDERED


def collective_op(body: Body, inputs: Sequence[tf.Tensor], tout: Sequence[tf.DType], name: str,
                  unordered: bool = False) -> List[tf.Tensor]:
    """Add a ``HorovodCollective`` node running ``body(outputs, *arrays)`` to the current graph; its outputs.

    ``unordered``: a ``HorovodCollectiveUnordered`` node instead, which a tf.function runs as soon as its inputs
    (and explicit control dependencies) allow, not after the function's previous stateful op: only for a body
    that never blocks (see ``unordered_available``)."""
    from tensorflow.python.framework import op_def_library

    token = next(_tokens)
    # A body defined while autograph converts the caller is converted code; run it with autograph disabled
    # (as numpy_function does), or every call inside it goes through autograph's converted_call machinery.
    _bodies[token] = tf.autograph.experimental.do_not_convert(body)
    weakref.finalize(_outermost(tf.compat.v1.get_default_graph()), _bodies.pop, token, None)
    op_type = UNORDERED_OP_TYPE if unordered else OP_TYPE
    _, _, op, _ = op_def_library._apply_op_helper(op_type, name=name, inputs=list(inputs), Tout=list(tout),
                                                  token=token)
    return list(op.outputs)
