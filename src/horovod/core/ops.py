"""The op layer: collectives as named requests on numpy buffers, returning handles.

Framework bindings convert their tensors into numpy views (zero-copy for CPU memory) and call these
functions. Here we check what one rank can check alone (supported dtype, contiguity, an op that exists for
the collective, alltoall splits that add up) and hand the request to the engine; everything that needs the
other ranks (shapes, dtypes, roots agreeing) is checked by the coordinator.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import cloudpickle
import numpy as np

from horovod.backends import device_ipc
from horovod.common.types import DataType, ReduceOp, RequestType, data_type_of
from horovod.core import basics
from horovod.core.controller.messages import HOST, group_requests, make_request, single_request
from horovod.core.engine import Entry, fast_rounds, output_pool
from horovod.core.engine.handles import Handle
from horovod.core.process_sets import ProcessSet

Allocator = Callable[[tuple, np.dtype], np.ndarray]
Allocators = Union[Allocator, Sequence[Allocator], None]
_counters: Dict[int, Iterator[int]] = {}      # process set id -> numbers of its unnamed collectives
_counted_generation: List[Optional[int]] = [None]   # the init whose collectives _counters numbers
_thread = threading.local()


class _Blocking:
    """The context manager :func:`blocking` returns (a class: a generator-based one costs a microsecond per call,
    a twentieth of a small blocking collective)."""

    __slots__ = ()

    def __enter__(self) -> None:
        _thread.blocking = True

    def __exit__(self, *exc_info) -> None:
        _thread.blocking = False


_BLOCKING = _Blocking()


def blocking() -> _Blocking:
    """Inside this block, the next allreduce, grouped allreduce, broadcast, allgather or reducescatter this thread
    submits is one its caller waits for at once (the bindings' blocking calls say so): a small one may then skip
    the coordinator (core/engine/fast_rounds.py).
    Never wrap an async call whose handle is kept: its op could then hold up the other ranks until waited on."""
    return _BLOCKING


def _submit(engine, entry) -> None:
    """Hand one op to its engine: as a blocking call's (it may take a fast round) when the caller promised to
    wait at once (:func:`blocking`), else queued."""
    if _take_blocking():
        engine.submit_blocking(entry)
    else:
        engine.enqueue([entry])


def _take_blocking() -> bool:
    """Whether the caller promised to wait at once (see :func:`blocking`); the promise covers one op."""
    if getattr(_thread, "blocking", False):
        _thread.blocking = False
        return True
    return False


def next_id(process_set: Optional[ProcessSet] = None) -> int:
    """An increasing number for default tensor names, counted per process set: every member numbers a set's
    unnamed collectives alike, whatever it runs on other sets (upstream counts per process, so a program that
    runs unnamed collectives on a set and then on the global set would give its ranks different names)."""
    generation = basics.generation()
    if generation != _counted_generation[0]:    # every init starts afresh: after an elastic reset, survivors and
        _counters.clear()                       # workers that just started must number alike
        _counted_generation[0] = generation
    key = process_set.process_set_id if process_set is not None and process_set.process_set_id else 0
    counter = _counters.get(key)
    if counter is None:
        counter = _counters[key] = itertools.count()
    return next(counter)


def tensor_name(op: str, name: Optional[str], handle_id: Optional[int] = None,
                process_set: Optional[ProcessSet] = None) -> str:
    """Upstream's naming: ``<op>.<name>``, or ``<op>.noname.<n>`` without a name (n counted per set)."""
    if name:
        return f"{op}.{name}"
    return f"{op}.noname.{next_id(process_set) if handle_id is None else handle_id}"


def _is_global(process_set: Optional[ProcessSet]) -> bool:
    return process_set is None or process_set.process_set_id in (0, None)


def set_size(process_set: Optional[ProcessSet]) -> int:
    """The number of ranks in ``process_set`` (the job's for None or the global set), for the bindings' Average
    and gradient rules."""
    return basics.size() if _is_global(process_set) else process_set.size()


def set_ranks(process_set: Optional[ProcessSet]) -> List[int]:
    """The global ranks of ``process_set``'s positions (every rank for None or the global set)."""
    return list(range(basics.size())) if _is_global(process_set) else list(process_set.ranks)


def set_rank(process_set: Optional[ProcessSet]) -> Optional[int]:
    """This rank's position in ``process_set`` (its global rank for None or the global set); None when it is not
    a member (a collective on the set then raises, naming it)."""
    return basics.rank() if _is_global(process_set) else process_set.rank()


def check_array(arr: np.ndarray) -> DataType:
    """The wire dtype of ``arr``; ValueError if it is not contiguous or its dtype is unsupported."""
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"expected a numpy array, got {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ValueError("Tensor is required to be contiguous. Call .copy() (numpy) or .contiguous() (torch) "
                         "on it before the collective.")
    return data_type_of(arr.dtype)


def describe(tensor, device: int = HOST) -> DataType:
    """The wire dtype of a host array (:func:`check_array`) or of a device array (its plane's ops say)."""
    if device == HOST:
        return check_array(tensor)
    return device_ipc.ops_for(device).data_type(tensor)


def _empty_like(tensor, device: int, dtype: Optional[DataType] = None):
    """A new output like ``tensor`` on its device (``dtype``: its wire dtype, when the caller already has it)."""
    if device == HOST:
        return output_pool.empty_like(tensor)
    return device_ipc.ops_for(device).empty(tuple(tensor.shape), dtype if dtype is not None else describe(tensor, device))


_ADASUM_DTYPES = frozenset({DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64})
# The members the per-call checks and requests use, as module globals: reading one costs a tenth of the enum class's
# attribute lookup, which a small blocking call made a dozen times (docs/benchmarks.md, issue 31).
_ADASUM, _AVERAGE, _SUM, _BOOL = ReduceOp.ADASUM, ReduceOp.AVERAGE, ReduceOp.SUM, DataType.BOOL
_ALLREDUCE, _ALLGATHER, _BROADCAST = RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.BROADCAST
_REDUCESCATTER = RequestType.REDUCESCATTER


def _as_op(op) -> ReduceOp:
    """``op`` as a ReduceOp (the enum's call, a quarter of a microsecond, only for what is not one already)."""
    return op if type(op) is ReduceOp else ReduceOp(op)


def _check_reduce(op: ReduceOp, dtype: DataType, what: str) -> ReduceOp:
    op = _as_op(op)
    if op == _ADASUM and dtype not in _ADASUM_DTYPES:
        raise ValueError(f"{what} with op=Adasum needs float16, float32 or float64 tensors, not "
                         f"{dtype.name.lower()}; cast the tensor, or use op=Sum or Average.")
    if dtype == _BOOL and op == _AVERAGE:
        raise ValueError(f"{what} with op=Average is not defined for bool tensors; use Sum (logical or), Min "
                         "(logical and) or Max.")
    return op


def _check_scale(dtype: DataType, prescale_factor: float, postscale_factor: float, what: str) -> None:
    """Scale factors other than 1 need a numeric dtype (upstream scales no bool tensors either)."""
    if dtype == _BOOL and (prescale_factor != 1.0 or postscale_factor != 1.0):
        raise ValueError(f"{what} cannot apply prescale_factor or postscale_factor to bool tensors; leave them "
                         "at 1.0 or cast the tensor to a numeric type.")


def has_fast_rounds(process_set: Optional[ProcessSet] = None) -> bool:
    """Whether a small blocking collective on ``process_set`` may take a fast round (core/engine/fast_rounds.py):
    every rank of the set shares this host and ``HOROVOD_FAST_ROUNDS`` is on. The same on every rank of the set
    (with that variable set alike)."""
    return _engine(process_set).fast is not None


def fast_group(sizes: Sequence[Union[int, Sequence[int]]], process_set: Optional[ProcessSet] = None) -> List[int]:
    """Which of several host tensors, or units of them (``sizes``: bytes each, or a unit's members' bytes, which go
    together or not at all), one blocking grouped allreduce on ``process_set`` can take in a single fast round
    (core/engine/fast_rounds.py, grouped rounds): their indices, those that take the least room first (in index
    order among equals), as many as fit together; none where the set has no fast rounds (its ranks span hosts,
    ``HOROVOD_FAST_ROUNDS=0``). The answer depends only on the sizes and the set, so every rank of the set gets
    the same one for the same sizes (HOROVOD_FAST_ROUNDS is alike on every rank)."""
    engine = _engine(process_set)
    if engine.fast is None:         # no fast rounds on this set (has_fast_rounds)
        return []
    rooms = [sum(fast_rounds.group_room(n) for n in ([s] if isinstance(s, int) else s)) for s in sizes]
    room = fast_rounds.group_capacity(engine.size)
    chosen = []
    for i in sorted(range(len(rooms)), key=lambda i: (rooms[i], i)):
        room -= rooms[i]
        if room < 0:
            break
        chosen.append(i)
    return sorted(chosen)


def _engine(process_set: Optional[ProcessSet] = None):
    """The engine that runs ``process_set``'s collectives (ValueError when this rank is not a member)."""
    return basics.engine_for(process_set)


def _per_tensor(allocate: Allocators, n: int) -> List[Optional[Allocator]]:
    """One allocator per tensor of a grouped op (a single callable is shared)."""
    if allocate is None or callable(allocate):
        return [allocate] * n
    allocate = list(allocate)
    if len(allocate) != n:
        raise ValueError(f"expected {n} allocators, got {len(allocate)}")
    return allocate


def allreduce_async(tensor: np.ndarray, output: Optional[np.ndarray] = None, name: Optional[str] = None,
                    op: ReduceOp = ReduceOp.AVERAGE, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Reduce ``tensor`` across ranks into ``output`` (a new array unless given; may be ``tensor`` itself)."""
    engine = _engine(process_set)
    dtype = describe(tensor, device)
    op = _check_reduce(op, dtype, "allreduce")
    _check_scale(dtype, prescale_factor, postscale_factor, "allreduce")
    name = name or tensor_name("allreduce", None, process_set=process_set)
    if output is None:
        output = _empty_like(tensor, device, dtype)
    handle = Handle(name)
    request = single_request(name, _ALLREDUCE, dtype, tensor.shape, op, prescale_factor, postscale_factor,
                             device=device)
    _submit(engine, Entry(request, tensor, output, handle))
    return handle


def grouped_allreduce_async(tensors: Sequence[np.ndarray], outputs: Optional[Sequence[np.ndarray]] = None,
                            name: Optional[str] = None, op: ReduceOp = ReduceOp.AVERAGE,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Allreduce a list of tensors negotiated and fused as one unit; the handle's result is a list."""
    engine = _engine(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    dtypes = [describe(t, device) for t in tensors]
    op = _as_op(op)
    for dtype in set(dtypes):
        _check_reduce(op, dtype, "grouped_allreduce")
        _check_scale(dtype, prescale_factor, postscale_factor, "grouped_allreduce")
    outputs = ([_empty_like(t, device, dtype) for t, dtype in zip(tensors, dtypes)] if outputs is None
               else list(outputs))
    base = name or tensor_name("grouped_allreduce", None, process_set=process_set)
    handle = Handle(base, parts=len(tensors), finish=list)
    requests = group_requests(base, _ALLREDUCE, dtypes, [t.shape for t in tensors], op, prescale_factor,
                              postscale_factor, device)
    entries = [Entry(request, t, out, handle, index=i)
               for i, (request, t, out) in enumerate(zip(requests, tensors, outputs))]
    if _take_blocking():
        engine.submit_blocking_group(entries)
    else:
        engine.enqueue(entries)
    return handle


def allgather_async(tensor: np.ndarray, name: Optional[str] = None, allocate: Optional[Allocator] = None,
                    process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks)."""
    engine = _engine(process_set)
    dtype = describe(tensor, device)
    if tensor.ndim == 0:
        raise ValueError("allgather needs a tensor with at least one dimension; reshape scalars to shape [1].")
    name = name or tensor_name("allgather", None, process_set=process_set)
    handle = Handle(name)
    request = single_request(name, _ALLGATHER, dtype, tensor.shape, device=device)
    _submit(engine, Entry(request, tensor, None, handle, allocate=allocate))
    return handle


def grouped_allgather_async(tensors: Sequence[np.ndarray], name: Optional[str] = None,
                            allocate: Allocators = None,
                            process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Allgather each tensor of a list, negotiated as one unit; the handle's result is a list."""
    engine = _engine(process_set)
    tensors = list(tensors)
    base = name or tensor_name("grouped_allgather", None, process_set=process_set)
    n = len(tensors)
    handle = Handle(base, parts=n, finish=list)
    entries = []
    for i, (t, alloc) in enumerate(zip(tensors, _per_tensor(allocate, n))):
        dtype = describe(t, device)
        if t.ndim == 0:
            raise ValueError("allgather needs tensors with at least one dimension.")
        request = make_request(f"{base}_{i}of{n}", RequestType.ALLGATHER, dtype, t.shape, group=base, group_size=n, device=device)
        entries.append(Entry(request, t, None, handle, index=i, allocate=alloc))
    engine.enqueue(entries)
    return handle


def broadcast_async(tensor: np.ndarray, root_rank: int, output: Optional[np.ndarray] = None,
                    name: Optional[str] = None, process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Copy ``root_rank``'s ``tensor`` to every rank (into ``output``, a new array unless given)."""
    engine = _engine(process_set)
    dtype = describe(tensor, device)
    name = name or tensor_name("broadcast", None, process_set=process_set)
    if output is None:
        output = _empty_like(tensor, device, dtype)
    handle = Handle(name)
    request = single_request(name, _BROADCAST, dtype, tensor.shape, root=int(root_rank), device=device)
    _submit(engine, Entry(request, tensor, output, handle))
    return handle


def alltoall_async(tensor: np.ndarray, splits: Optional[Sequence[int]] = None, name: Optional[str] = None,
                   allocate: Optional[Allocator] = None, process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Send ``splits[j]`` rows of ``tensor`` to rank j; the result is (output, received_splits)."""
    engine = _engine(process_set)
    dtype = describe(tensor, device)
    size = engine.size
    if tensor.ndim == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension.")
    if splits is None:
        if tensor.shape[0] % size:
            raise ValueError(f"alltoall without splits divides dim 0 ({tensor.shape[0]}) equally among {size} "
                             "ranks, which is not possible; pass splits= explicitly.")
        splits = [tensor.shape[0] // size] * size
    splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(splits) != size:
        raise ValueError(f"alltoall splits must have one entry per rank ({size}), got {len(splits)}.")
    if any(s < 0 for s in splits) or sum(splits) != tensor.shape[0]:
        raise ValueError(f"alltoall splits {splits} must be non-negative and add up to dim 0 ({tensor.shape[0]}).")
    name = name or tensor_name("alltoall", None, process_set=process_set)
    handle = Handle(name)
    request = make_request(name, RequestType.ALLTOALL, dtype, tensor.shape, splits=splits, device=device)
    engine.enqueue([Entry(request, tensor, None, handle, allocate=allocate)])
    return handle


def reducescatter_async(tensor: np.ndarray, name: Optional[str] = None, op: ReduceOp = ReduceOp.AVERAGE,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        allocate: Optional[Allocator] = None, process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Reduce ``tensor`` across ranks and keep this rank's block of dim 0 (ranks < n % size get one more row)."""
    engine = _engine(process_set)
    dtype = describe(tensor, device)
    op = _as_op(op)
    if op != _SUM and op != _AVERAGE:
        raise ValueError(f"reducescatter supports op=Sum and op=Average, not {op.name.capitalize()}.")
    if tensor.ndim == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension.")
    op = _check_reduce(op, dtype, "reducescatter")
    _check_scale(dtype, prescale_factor, postscale_factor, "reducescatter")
    name = name or tensor_name("reducescatter", None, process_set=process_set)
    handle = Handle(name)
    request = single_request(name, _REDUCESCATTER, dtype, tensor.shape, op, prescale_factor,
                             postscale_factor, device=device)
    _submit(engine, Entry(request, tensor, None, handle, allocate=allocate))
    return handle


def grouped_reducescatter_async(tensors: Sequence[np.ndarray], name: Optional[str] = None,
                                op: ReduceOp = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, allocate: Allocators = None,
                                process_set: Optional[ProcessSet] = None, device: int = HOST) -> Handle:
    """Reducescatter each tensor of a list, negotiated as one unit; the handle's result is a list."""
    engine = _engine(process_set)
    tensors = list(tensors)
    base = name or tensor_name("grouped_reducescatter", None, process_set=process_set)
    n = len(tensors)
    op = _as_op(op)
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"reducescatter supports op=Sum and op=Average, not {op.name.capitalize()}.")
    handle = Handle(base, parts=n, finish=list)
    entries = []
    for i, (t, alloc) in enumerate(zip(tensors, _per_tensor(allocate, n))):
        dtype = describe(t, device)
        if t.ndim == 0:
            raise ValueError("reducescatter needs tensors with at least one dimension.")
        _check_reduce(op, dtype, "grouped_reducescatter")
        _check_scale(dtype, prescale_factor, postscale_factor, "grouped_reducescatter")
        request = make_request(f"{base}_{i}of{n}", RequestType.REDUCESCATTER, dtype, t.shape, op, prescale_factor,
                               postscale_factor, group=base, group_size=n, device=device)
        entries.append(Entry(request, t, None, handle, index=i, allocate=alloc))
    engine.enqueue(entries)
    return handle


def barrier_async(process_set: Optional[ProcessSet] = None) -> Handle:
    """Completes once every rank has entered the barrier."""
    engine = _engine(process_set)
    name = "barrier.noname"
    handle = Handle(name)
    engine.enqueue([Entry(make_request(name, RequestType.BARRIER, DataType.UINT8, []), None, None, handle)])
    return handle


def join_async(process_set: Optional[ProcessSet] = None) -> Handle:
    """Mark this rank as joined; completes with the last rank to join once every rank has."""
    engine = _engine(process_set)
    name = "join.noname"
    handle = Handle(name)
    engine.enqueue([Entry(make_request(name, RequestType.JOIN, DataType.UINT8, []), None, None, handle)])
    return handle


# ------------------------------------------------------------------ objects
def broadcast_object(obj, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None):
    """Send a picklable object from ``root_rank`` to every rank (cloudpickle between authenticated peers): two
    blocking broadcasts, its size and its bytes, each a fast round where one applies."""
    name = name or type(obj).__name__
    if basics.rank() == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
        size = np.array([payload.size], np.int64)
    else:
        payload = None
        size = np.zeros(1, np.int64)
    with blocking():
        broadcast_async(size, root_rank, output=size, name=f"broadcast_object.{name}.sz",
                        process_set=process_set).wait()
    if payload is None:
        payload = np.empty(int(size[0]), np.uint8)
    with blocking():
        result = broadcast_async(payload, root_rank, output=payload if basics.rank() != root_rank else None,
                                 name=f"broadcast_object.{name}.t", process_set=process_set).wait()
    if basics.rank() == root_rank:
        return obj
    return cloudpickle.loads(result.tobytes())


def allgather_object(obj, name: Optional[str] = None, process_set: Optional[ProcessSet] = None) -> List:
    """Gather one picklable object from every rank, as a list indexed by rank."""
    name = name or type(obj).__name__
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
    with blocking():
        sizes = allgather_async(np.array([payload.size], np.int64), name=f"allgather_object.{name}.sz",
                                process_set=process_set).wait()
    with blocking():        # (a fast round needs every rank's payload of one size: otherwise the coordinator)
        data = allgather_async(payload, name=f"allgather_object.{name}.t", process_set=process_set).wait()
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
