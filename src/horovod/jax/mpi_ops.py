"""``horovod.jax``'s collectives on ``jax.Array``s, eagerly and inside ``jax.jit``, differentiable.

Each collective runs through ``host_calls.call_on_host`` (numpy views eagerly, an ordered ``io_callback`` under
a trace). When its inputs are traced (jit, grad), it is wrapped in ``jax.custom_vjp`` with ``horovod.torch``'s
gradient rules: allreduce -> the allreduce of the gradient with the same op and factors; allgather -> the
gradient averaged across ranks, this rank's rows; broadcast -> averaged, zero off the root; alltoall -> sent
back with the received splits; reducescatter -> scaled (Sum: by the size; then the factors), then allgathered.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from horovod.common import types as _types
from horovod.common.types import Average, ReduceOp, data_type_of
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.jax import host_ops
from horovod.jax.arrays import check_array, is_traced, shapes_of
from horovod.jax.compression import Compression
from horovod.jax.host_calls import call_on_host

__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
           "reducescatter", "grouped_reducescatter", "barrier", "join"]

_handle_op = get_average_backwards_compatibility_fun(_types)
Primal = Callable[[List[Any]], List[Any]]
Backward = Callable[[List[Any], List[Any], List[Any]], List[Any]]


def _checked(tensors: Sequence[Any], what: str) -> List[jax.Array]:
    """The inputs as JAX arrays, their dtypes checked now (at trace time under jit), not inside the callback."""
    arrays = [check_array(t, what) for t in tensors]
    for a in arrays:
        data_type_of(np.dtype(a.dtype))
    return arrays


def _differentiable(primal: Primal, backward: Backward, arrays: List[Any]) -> List[Any]:
    """``primal(arrays)``; under a trace, as a ``jax.custom_vjp`` whose backward is ``backward(inputs, outputs,
    cotangents)`` (integer inputs get no gradient)."""
    if not is_traced(*arrays):
        return primal(arrays)

    @jax.custom_vjp
    def f(*xs):
        return tuple(primal(list(xs)))

    def fwd(*xs):
        outs = tuple(primal(list(xs)))
        return outs, (xs, outs)

    def bwd(res, cts):
        xs, outs = res
        grads = backward(list(xs), list(outs), list(cts))
        return tuple(g if jnp.issubdtype(x.dtype, jnp.inexact) else None for g, x in zip(grads, xs))

    f.defvjp(fwd, bwd)
    return list(f(*arrays))


# ------------------------------------------------------------------ allreduce
def _allreduce(arrays: List[Any], name, op, prescale_factor, postscale_factor, process_set, grouped) -> List[Any]:
    def primal(xs):
        return call_on_host(host_ops.allreduce(name, op, prescale_factor, postscale_factor, process_set, grouped),
                            xs, shapes_of(xs))

    def backward(xs, outs, cts):
        return call_on_host(host_ops.allreduce(None, op, prescale_factor, postscale_factor, process_set, grouped),
                            cts, shapes_of(cts))

    return _differentiable(primal, backward, arrays)


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression=Compression.none, op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> jax.Array:
    """Reduce ``tensor`` across ranks (Average by default) into a new array; differentiable, works under jit.

    ``compression`` (e.g. ``Compression.fp16``) shrinks what goes on the wire; the result has the input dtype.
    """
    op = _handle_op(op, average)
    (tensor,) = _checked([tensor], "allreduce")
    compressed, ctx = compression.compress(tensor)
    (out,) = _allreduce([compressed], name, op, prescale_factor, postscale_factor, process_set, grouped=False)
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> List[jax.Array]:
    """Allreduce a list of arrays negotiated and fused as one unit; differentiable, works under jit."""
    op = _handle_op(op, average)
    tensors = _checked(tensors, "grouped_allreduce")
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    compressed = [compression.compress(t) for t in tensors]
    outs = _allreduce([c for c, _ in compressed], name, op, prescale_factor, postscale_factor, process_set,
                      grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


# ------------------------------------------------------------------ allgather
def _gathered_shape(x: Any, process_set: ProcessSet) -> jax.ShapeDtypeStruct:
    """The traced output shape of an allgather: every rank's first dim assumed equal to this rank's."""
    if not x.shape:
        raise ValueError("allgather needs a tensor with at least one dimension; reshape scalars to shape [1].")
    return jax.ShapeDtypeStruct((x.shape[0] * ops.set_size(process_set), *x.shape[1:]), x.dtype)


def _allgather(arrays: List[Any], name, process_set, grouped) -> List[Any]:
    def primal(xs):
        fn = host_ops.allgather(name, process_set, grouped, equal_first_dims=is_traced(*xs))
        return call_on_host(fn, xs, [_gathered_shape(x, process_set) for x in xs])

    def backward(xs, outs, cts):
        dims = jnp.asarray([x.shape[0] for x in xs], jnp.int32)
        return call_on_host(host_ops.allgather_grad(process_set), [*cts, dims],
                            [jax.ShapeDtypeStruct(x.shape, c.dtype) for x, c in zip(xs, cts)])

    return _differentiable(primal, backward, arrays)


def allgather(tensor: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> jax.Array:
    """Concatenate every rank's ``tensor`` along dim 0; differentiable.

    Eagerly dim 0 may differ between ranks. Under jit the output shape is fixed when the program is traced, so
    every rank must pass the same dim 0 (a ValueError naming the ranks' dims otherwise).
    """
    (tensor,) = _checked([tensor], "allgather")
    return _allgather([tensor], name, process_set, grouped=False)[0]


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[jax.Array]:
    """Allgather each array of a list, as one unit; differentiable (each gradient as allgather's)."""
    return _allgather(_checked(tensors, "grouped_allgather"), name, process_set, grouped=True)


# ------------------------------------------------------------------ broadcast
def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> jax.Array:
    """Return ``root_rank``'s ``tensor`` on every rank; differentiable (the gradient is averaged across ranks
    and kept only on the root)."""
    (tensor,) = _checked([tensor], "broadcast")
    root_rank = int(root_rank)

    def primal(xs):
        return call_on_host(host_ops.broadcast(root_rank, name, process_set), xs, shapes_of(xs))

    def backward(xs, outs, cts):
        return call_on_host(host_ops.broadcast_grad(root_rank, process_set), cts, shapes_of(cts))

    return _differentiable(primal, backward, [tensor])[0]


# ------------------------------------------------------------------ alltoall
def alltoall(tensor: Any, splits=None, name: Optional[str] = None, process_set: ProcessSet = global_process_set):
    """Scatter rows of ``tensor`` to every rank and gather theirs; differentiable.

    Returns the output when ``splits`` is None (dim 0 split equally), else ``(output, received_splits)``.
    Under jit only ``splits=None`` is possible (with explicit splits the output's dim 0 depends on the other
    ranks' splits, unknown when the program is traced), and every rank must pass the same dim 0.
    """
    (tensor,) = _checked([tensor], "alltoall")
    static_splits = None if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    size = ops.set_size(process_set)

    def primal(xs):
        if splits is not None and is_traced(*xs):
            raise ValueError("alltoall with splits= cannot run inside jax.jit: the output's first dimension "
                             "depends on the other ranks' splits, which are unknown when the program is traced. "
                             "Call it outside jit (jax.grad alone is fine), or use splits=None (equal splits).")
        return call_on_host(host_ops.alltoall(static_splits, name, process_set), xs,
                            [*shapes_of(xs), jax.ShapeDtypeStruct((size,), jnp.int32)])

    def backward(xs, outs, cts):
        return call_on_host(host_ops.alltoall(None, None, process_set), [cts[0], outs[1]], shapes_of(xs))[:1]

    out, received = _differentiable(primal, backward, [tensor])
    return out if splits is None else (out, received)


# ------------------------------------------------------------------ reducescatter
def _reducescatter(arrays, name, op, prescale_factor, postscale_factor, process_set, grouped) -> List[Any]:
    for a in arrays:
        if not a.shape:
            raise ValueError("reducescatter needs a tensor with at least one dimension.")

    def primal(xs):
        fn = host_ops.reducescatter(name, op, prescale_factor, postscale_factor, process_set, grouped)
        return call_on_host(fn, xs, [jax.ShapeDtypeStruct(
            (host_ops.reducescatter_rows(x.shape[0], process_set), *x.shape[1:]), x.dtype) for x in xs])

    def backward(xs, outs, cts):
        fn = host_ops.reducescatter_grad(op, prescale_factor, postscale_factor, process_set)
        return call_on_host(fn, cts, [jax.ShapeDtypeStruct(x.shape, c.dtype) for x, c in zip(xs, cts)])

    return _differentiable(primal, backward, arrays)


def reducescatter(tensor: Any, name: Optional[str] = None, compression=Compression.none, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> jax.Array:
    """Reduce across ranks and return this rank's block of dim 0 (ranks < n % size get one more row);
    differentiable, works under jit."""
    (tensor,) = _checked([tensor], "reducescatter")
    compressed, ctx = compression.compress(tensor)
    (out,) = _reducescatter([compressed], name, op, prescale_factor, postscale_factor, process_set, grouped=False)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[Any], name: Optional[str] = None, compression=Compression.none,
                          op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[jax.Array]:
    """Reducescatter each array of a list, as one unit; differentiable, works under jit."""
    compressed = [compression.compress(t) for t in _checked(tensors, "grouped_reducescatter")]
    outs = _reducescatter([c for c, _ in compressed], name, op, prescale_factor, postscale_factor, process_set,
                          grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


# ------------------------------------------------------------------ control
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of ``process_set``) has reached the barrier; inside jit, when the program runs."""
    call_on_host(host_ops.barrier(process_set), [], [])


def join(process_set: ProcessSet = global_process_set) -> Any:
    """Wait until every rank has joined; returns the last rank to join (an int eagerly, an int32 array inside
    jit). While joined, this rank contributes zeros to other ranks' allreduces."""
    (last,) = call_on_host(host_ops.join(process_set), [], [jax.ShapeDtypeStruct((), jnp.int32)])
    return last if isinstance(last, jax.core.Tracer) else int(last)
