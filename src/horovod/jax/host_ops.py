"""The collectives as host functions on numpy arrays, for ``host_calls.call_on_host``.

Each builder binds a collective's options and returns ``fn(*arrays) -> list of numpy arrays``. A single
allreduce, allgather, broadcast or reducescatter waits for its op at once, and says so (``ops.blocking``): on one
host it may then take a fast round, across hosts the carried path, as the other bindings' blocking calls do. Names are made when
the function runs, not when a program is traced: unnamed collectives are numbered in the order they run, which
is the same on every rank (eager calls in program order, jitted ones as ordered callbacks), whatever each rank
traced or cached. Gradient rules (as ``horovod.torch.autograd_ops``) are host functions here too.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

from horovod.common.types import Average, ReduceOp, Sum
from horovod.core import basics, ops
from horovod.core.process_sets import ProcessSet

HostFn = Callable[..., List[np.ndarray]]


def _name(op: str, name: Optional[str], process_set: ProcessSet) -> str:
    return ops.tensor_name(op, name, process_set=process_set)


def allreduce(name: Optional[str], op: ReduceOp, prescale_factor: float, postscale_factor: float,
              process_set: ProcessSet, grouped: bool) -> HostFn:
    """Allreduce one array (``grouped`` False) or a list of arrays as one fused unit."""
    def run(*arrays: np.ndarray) -> List[np.ndarray]:
        with ops.blocking():
            if not grouped:
                return [ops.allreduce_async(arrays[0], None, _name("allreduce", name, process_set), op,
                                            prescale_factor, postscale_factor, process_set).wait()]
            return list(ops.grouped_allreduce_async(arrays, None, _name("grouped_allreduce", name, process_set),
                                                    op, prescale_factor, postscale_factor, process_set).wait())
    return run


def allgather(name: Optional[str], process_set: ProcessSet, grouped: bool, equal_first_dims: bool) -> HostFn:
    """Allgather along dim 0. ``equal_first_dims`` (under jit, where the output shape was traced as ``size *
    dim 0``): the first dims travel with the data, and every rank raises the same ValueError naming them when
    they differ."""
    def run(*arrays: np.ndarray) -> List[np.ndarray]:
        op_name = "grouped_allgather" if grouped else "allgather"
        full = _name(op_name, name, process_set)
        if not equal_first_dims:
            if not grouped:
                with ops.blocking():
                    return [ops.allgather_async(arrays[0], full, process_set=process_set).wait()]
            return list(ops.grouped_allgather_async(arrays, full, process_set=process_set).wait())
        dims = np.array([[a.shape[0] if a.ndim else 0 for a in arrays]], np.int64)
        *gathered, all_dims = ops.grouped_allgather_async([*arrays, dims], full, process_set=process_set).wait()
        if (all_dims != all_dims[0]).any():
            raise ValueError(f"{op_name} inside jax.jit needs the same first dimension on every rank (the output "
                             f"shape is fixed when the program is traced), got first dimensions "
                             f"{all_dims.T.tolist() if grouped else all_dims[:, 0].tolist()} on the ranks; call "
                             "it outside jit, or pad every rank's array to the same length.")
        return gathered
    return run


def broadcast(root_rank: int, name: Optional[str], process_set: ProcessSet) -> HostFn:
    """Broadcast one array from ``root_rank``."""
    def run(array: np.ndarray) -> List[np.ndarray]:
        with ops.blocking():
            return [ops.broadcast_async(array, root_rank, None, _name("broadcast", name, process_set),
                                        process_set).wait()]
    return run


def broadcast_many(root_rank: int, names: Sequence[str], process_set: ProcessSet) -> HostFn:
    """Broadcast every array of a list from ``root_rank`` (all started, then all awaited), named ``names``."""
    def run(*arrays: np.ndarray) -> List[np.ndarray]:
        handles = [ops.broadcast_async(a, root_rank, None, n, process_set) for a, n in zip(arrays, names)]
        return [h.wait() for h in handles]
    return run


def alltoall(splits: Optional[Sequence[int]], name: Optional[str], process_set: ProcessSet) -> HostFn:
    """Alltoall; returns ``[output, received_splits]`` (int32 splits)."""
    def run(array: np.ndarray, *given_splits: np.ndarray) -> List[np.ndarray]:
        use = given_splits[0] if given_splits else splits
        out, received = ops.alltoall_async(array, use, _name("alltoall", name, process_set),
                                           process_set=process_set).wait()
        return [out, np.asarray(received, np.int32)]
    return run


def reducescatter(name: Optional[str], op: ReduceOp, prescale_factor: float, postscale_factor: float,
                  process_set: ProcessSet, grouped: bool) -> HostFn:
    """Reducescatter one array or, as one unit, each of a list."""
    def run(*arrays: np.ndarray) -> List[np.ndarray]:
        if not grouped:
            with ops.blocking():
                return [ops.reducescatter_async(arrays[0], _name("reducescatter", name, process_set), op,
                                                prescale_factor, postscale_factor, process_set=process_set).wait()]
        return list(ops.grouped_reducescatter_async(arrays, _name("grouped_reducescatter", name, process_set), op,
                                                    prescale_factor, postscale_factor,
                                                    process_set=process_set).wait())
    return run


def reducescatter_rows(rows: int, process_set: ProcessSet) -> int:
    """This rank's share of ``rows`` in a reducescatter (ranks below ``rows % size`` get one more)."""
    size, rank = ops.set_size(process_set), ops.set_rank(process_set) or 0
    return rows // size + (1 if rank < rows % size else 0)


def barrier(process_set: ProcessSet) -> HostFn:
    def run() -> List[np.ndarray]:
        ops.barrier_async(process_set).wait()
        return []
    return run


def join(process_set: ProcessSet) -> HostFn:
    def run() -> List[np.ndarray]:
        return [np.asarray(ops.join_async(process_set).wait(), np.int32)]
    return run


# ------------------------------------------------------------------ gradient rules (horovod.torch's)
def allgather_grad(process_set: ProcessSet) -> HostFn:
    """Allgather's backward for a list of inputs with first dims ``dims``: each cotangent averaged across ranks
    (one grouped allreduce), then this rank's rows (offsets from an allgather of every rank's first dims)."""
    def run(*cotangents: np.ndarray) -> List[np.ndarray]:
        *cts, dims = cotangents
        with ops.blocking():
            reduced = ops.grouped_allreduce_async(cts, None, None, Average, 1.0, 1.0, process_set).wait()
        with ops.blocking():
            all_dims = ops.allgather_async(dims.reshape(1, -1).astype(np.int64), process_set=process_set).wait()
        offsets = all_dims[: ops.set_rank(process_set) or 0].sum(axis=0)
        return [r[o:o + d] for r, o, d in zip(reduced, offsets.tolist(), dims.tolist())]
    return run


def broadcast_grad(root_rank: int, process_set: ProcessSet) -> HostFn:
    """Broadcast's backward: the cotangent averaged across ranks, kept on the root and zero elsewhere."""
    def run(cotangent: np.ndarray) -> List[np.ndarray]:
        with ops.blocking():
            reduced = ops.allreduce_async(cotangent, None, None, Average, 1.0, 1.0, process_set).wait()
        return [reduced if basics.rank() == root_rank else np.zeros_like(reduced)]
    return run


def reducescatter_grad(op: ReduceOp, prescale_factor: float, postscale_factor: float,
                       process_set: ProcessSet) -> HostFn:
    """Reducescatter's backward (upstream's): Sum multiplies by the set's size, both ops by the prescale and the
    postscale factor, then the cotangents are allgathered (as one unit)."""
    factor = (ops.set_size(process_set) if ReduceOp(op) == Sum else 1) * prescale_factor * postscale_factor

    def run(*cotangents: np.ndarray) -> List[np.ndarray]:
        scaled = [c * np.asarray(factor, c.dtype) if factor != 1 else c for c in cotangents]
        return list(ops.grouped_allgather_async(scaled, process_set=process_set).wait())
    return run
