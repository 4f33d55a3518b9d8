"""Gradient allreduces that start as soon as each gradient exists, inside a ``tf.function`` (as upstream's
``DistributedGradientTape``, whose asynchronous kernels let TensorFlow's executor start each allreduce while the
rest of the backward pass is still computed).

Our ``HorovodCollective`` kernel is synchronous: a kernel that waits holds the thread it runs on, so the
collectives of a function graph are chained (``graph_call``) and a grouped allreduce of all gradients waits for
the last one. Here each gradient's allreduce is split in two nodes:

- a **start** node per gradient, or per group of small gradients (``plan``), that depends on its gradients only
  and on the collective chained before, and that tf.function does not order after its other stateful ops
  (``kernel.collective_op(unordered=True)``): it hands TensorFlow's input buffers and TensorFlow-allocated
  output buffers to the engine, keeps them alive (``Outputs.keep``) and returns at once with the outputs and a
  ticket;
- one **finish** node that takes every ticket, waits on the handles and releases the buffers; the reduced
  gradients are the start nodes' outputs behind an ``Identity`` that depends on the finish node.

No wait can deadlock: every start returns without waiting, and the finish node (the only one that waits) runs
after all starts of its group, so each rank has submitted every tensor of the group before it blocks; the next
collective of the chain depends on the finish node.

It is off unless ``HOROVOD_TF_OVERLAP_BYTES`` is set (see ``ALONE_BYTES``): on a host where every core computes,
the engine's copies and sums have no idle core to run on, and starting them early measured slower than one
grouped allreduce after the backward pass.
"""
from __future__ import annotations

import itertools
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from horovod.common import config
from horovod.common.types import ReduceOp
from horovod.core import ops
from horovod.core.engine.handles import Handle
from horovod.core.process_sets import ProcessSet
from horovod.tensorflow import graph_call, kernel

try:
    from tensorflow.python.eager.record import could_possibly_record as _could_possibly_record
except ImportError:  # pragma: no cover - older or newer TF without the private helper: assume a tape records
    def _could_possibly_record() -> bool:
        return True

_tickets = itertools.count(1)
_pending: Dict[int, Tuple[Handle, kernel.Lease]] = {}
_pending_lock = threading.Lock()

# Off by default (None): DistributedGradientTape then sends all dense gradients as one grouped allreduce after
# the backward pass, which measured faster where every core computes (docs/benchmarks.md, "TensorFlow scaling,
# issue 15"). A number of bytes turns the early starts on: gradients of at least that many bytes start alone as
# soon as they exist, the smaller ones together (0: every gradient alone, as upstream).
ENV = "HOROVOD_TF_OVERLAP_BYTES"


def _alone_bytes() -> Optional[int]:
    """``HOROVOD_TF_OVERLAP_BYTES`` as a number of bytes, or None when unset (early starts off)."""
    value = config.get(ENV)
    return None if value is None else max(0, int(value))


ALONE_BYTES: Optional[int] = _alone_bytes()


def usable() -> bool:
    """True where the split applies: turned on (``ALONE_BYTES``), a function graph being built, with the
    ``HorovodCollective`` kernel, and no tape that could record (the start nodes have no gradient, unlike
    ``grouped_allreduce``)."""
    if ALONE_BYTES is None or tf.executing_eagerly() or not kernel.unordered_available():
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(getattr(graph, "building_function", False)) and not _could_possibly_record()


def in_flight() -> int:
    """Allreduces started by a start node and not yet finished (for tests: 0 after every completed step)."""
    with _pending_lock:
        return len(_pending)


def _start_body(name: str, op: ReduceOp, prescale: float, postscale: float, process_set: ProcessSet):
    def start(outputs, *arrays):
        outs = [outputs.empty(i, a.shape, a.dtype) for i, a in enumerate(arrays)]
        lease = outputs.keep()      # the engine reads ``arrays`` and writes ``outs`` after this kernel returned
        try:
            if len(arrays) == 1:
                handle = ops.allreduce_async(arrays[0], outs[0], name, op, prescale, postscale, process_set)
            else:
                handle = ops.grouped_allreduce_async(list(arrays), outs, name, op, prescale, postscale, process_set)
        except BaseException:
            lease.release()
            raise
        ticket = next(_tickets)
        with _pending_lock:
            _pending[ticket] = (handle, lease)
        return [*outs, np.asarray(ticket, np.int64)]
    return start


def _finish(outputs, *tickets) -> List[np.ndarray]:
    """Wait for every ticket's allreduce (all of them, even after a failure), release their buffers, and raise
    the first error."""
    error: Optional[BaseException] = None
    for ticket in tickets:
        with _pending_lock:
            handle, lease = _pending.pop(int(ticket))
        try:
            handle.wait()
        except BaseException as exc:  # the op's status; the other handles still complete and release
            error = error or exc
        finally:
            lease.release()
    if error is not None:
        raise error
    return [np.asarray(len(tickets), np.int32)]


def plan(nbytes: Sequence[int], alone_bytes: int) -> List[List[int]]:
    """Which tensors start together: each tensor of at least ``alone_bytes`` alone, as soon as it exists; all
    the smaller ones in one group (it starts when the last of them exists). Each start node costs a Python call
    and a negotiation; a small tensor has nothing worth overlapping."""
    alone = [[i] for i, n in enumerate(nbytes) if n >= alone_bytes]
    small = [i for i, n in enumerate(nbytes) if n < alone_bytes]
    return alone + ([small] if small else [])


def allreduce_as_ready(tensors: Sequence[tf.Tensor], names: Sequence[str], op: ReduceOp, prescale: float,
                       postscale: float, process_set: ProcessSet,
                       groups: Optional[List[List[int]]] = None) -> List[tf.Tensor]:
    """Allreduce the tensors, each group of positions in ``groups`` (default: every tensor alone) as one engine
    op named after its first member, started as soon as its tensors exist; see the module docstring. Call only
    where :func:`usable` is True."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    groups = groups if groups is not None else [[i] for i in range(len(tensors))]
    graph = tf.compat.v1.get_default_graph()
    previous = graph_call.chain_last(graph)
    data: List[Optional[tf.Tensor]] = [None] * len(tensors)
    tickets = []
    with tf.device("/cpu:0"):
        for group in groups:
            inputs = [tensors[i] for i in group]
            body = _start_body(names[group[0]], ReduceOp(op), prescale, postscale, process_set)
            with tf.control_dependencies([previous] if previous is not None else []):
                outs = kernel.collective_op(body, inputs, [t.dtype for t in inputs] + [tf.int64],
                                            "HorovodAllreduceStart", unordered=True)
            for i, out in zip(group, outs):
                out.set_shape(tensors[i].shape)
                data[i] = out
            tickets.append(outs[-1])
        done = kernel.collective_op(_finish, tickets, [tf.int32], "HorovodAllreduceFinish")[0]
        graph_call.set_chain_last(graph, done.op)
        with tf.control_dependencies([done]):
            return [tf.identity(d) for d in data]
