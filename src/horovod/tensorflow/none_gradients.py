"""Gradients that are None on some ranks only: one error, on every rank, that names the variable.

A gradient is None where the loss does not depend on the variable. Upstream skips None gradients, and so do we:
when every rank has None for a variable, nothing is exchanged for it and the result is None, as before. But when
some ranks have a gradient and others None, the ranks would submit different allreduces (a grouped allreduce of
three tensors on one rank, of two on another) and wait for each other for ever; the deadlock detector then ends
the step after ``HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS`` with internal names such as
``grouped_allreduce.DistributedGradientTape.group0_1of3``.

**How.** Before a step's gradient collectives, every rank submits one small allreduce (Sum, int32) of its
*presence vector* (``horovod.common.gradient_presence``): a 1, then a 1 for each gradient that is None here. The
sum is the same on every rank, so every rank reaches the same verdict from it. When some gradient is None on
some of the ranks but not all, the ranks gather each other's flags (that second, tiny collective runs only then)
and every rank raises :class:`NoneGradientError`, naming the variable and the ranks on either side, before any
gradient collective was submitted: nothing is left half-negotiated, so a program (or a test) that catches the
error can go on with matching steps. Ranks with different numbers of gradients (a layer built on some ranks only)
send vectors of different lengths; the coordinator's shape mismatch on the check's tensor becomes an error that
says how many each rank has (``gradient_presence.count_mismatch_message``).

**Why this and not the coordinator's mismatch error.** The None pattern changes the set of tensors the ranks
submit, not one tensor's shape, so what surfaces today is a deadlock after seconds, not a prompt mismatch; and
with ``sparse_as_dense=False`` or ``groups`` the mismatched tensors take different paths (allgathers, several
groups), which no single translation covers. The presence check does not depend on how the gradients travel
afterwards.

**Cost.** The check is a blocking allreduce of ``4 * (n + 1)`` bytes: the engine's fast round when the ranks
share a host (41 µs on the idle 2-core VM, docs/benchmarks.md), a coordinator round trip otherwise. It runs inside the node of
the first grouped allreduce (:func:`grouped_allreduce_checked`), because in a ``tf.function`` a node of its own
measured as costly as a small collective (about 3 ms a step on the loaded 2-core VM, against 0.4-0.5 ms inside
the gradients' node); only a rank with no dense gradient at all runs it in a node of its own
(:func:`check_node`), which its peers' checks still match, since the check's tensor has the same name wherever
it runs. The None pattern is read when the function is traced (it is fixed in a graph).

**Not covered:** the early starts of ``HOROVOD_TF_OVERLAP_BYTES`` (off by default). Each start node must depend
on its own gradient only, so that it starts as soon as that gradient exists; a check before them would hold
them all back, and a check after them would leave mismatched allreduces behind. A None mismatch there still ends
in the deadlock report.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from horovod.common import gradient_presence as presence
from horovod.common.types import ReduceOp
from horovod.core import ops
from horovod.core.presence_check import verdict_on_host
from horovod.core.process_sets import ProcessSet
from horovod.tensorflow import errors, graph_call, mpi_ops


class NoneGradientError(errors.InvalidArgumentError):
    """A gradient is None on some ranks but not on others (raised on every rank); a ValueError too."""


TAPE_REMEDY = ("Make the loss depend on the same variables on every rank, pass "
               "unconnected_gradients=tf.UnconnectedGradients.ZERO to tape.gradient(...) to get zeros instead of "
               "None, or leave the variable out of the sources on every rank.")


def host_check(grads: Sequence, variables: Optional[Sequence], name: str, process_set: ProcessSet,
               who: str = "DistributedGradientTape", remedy: str = TAPE_REMEDY) -> Callable[[], None]:
    """A host function that runs the check for ``grads`` (their None pattern is read now, when a graph is
    traced) and raises :class:`NoneGradientError` on every rank when some are None on some ranks only."""
    grads = list(grads)
    labels = [presence.label(None if variables is None else variables[i], i) for i in range(len(grads))]
    vector = presence.presence_vector([g is None for g in grads])

    def check() -> None:
        message = verdict_on_host(vector, labels, name, process_set, who, remedy)
        if message is not None:
            raise errors.make(NoneGradientError, message)

    return check


def check_node(check: Callable[[], None]) -> None:
    """Run ``check`` now (eagerly) or as a node of its own, chained before the collectives built after it. Used
    when this rank has no dense gradient to carry the check (see :func:`grouped_allreduce_checked`)."""
    def compute(outputs, array):
        check()
        return [np.asarray(array)]

    graph_call.call(compute, [tf.zeros([1], tf.int32)], [tf.int32], "HorovodGradientsPresent")


def grouped_allreduce_checked(tensors: Sequence, name: str, op: ReduceOp, prescale_factor: float,
                              postscale_factor: float, process_set: ProcessSet,
                              check: Callable[[], None]) -> List[tf.Tensor]:
    """``mpi_ops._grouped_allreduce(tensors, name, ignore_name_scope=True, ...)`` whose node runs ``check``
    first: the presence check rides in the gradients' own node, since a node of its own costs about as much as
    a small collective in a ``tf.function`` (see the module docstring)."""
    tensors = [mpi_ops._tensor(t, mpi_ops._REDUCE_DTYPES, "grouped_allreduce") for t in tensors]
    op = ReduceOp(op)
    base = mpi_ops._name("grouped_allreduce", name, True, process_set)

    def fwd(*xs):
        def compute(outputs, *arrays):
            check()
            outs = [outputs.empty(i, a.shape, a.dtype) for i, a in enumerate(arrays)]
            with ops.blocking():
                return list(ops.grouped_allreduce_async(list(arrays), outs, base, op, prescale_factor,
                                                        postscale_factor, process_set).wait())

        outs = graph_call.call(compute, xs, [x.dtype for x in xs], "HorovodGroupedAllreduce")
        outs = [mpi_ops._set_shape(o, x.shape) for o, x in zip(outs, xs)]

        def grad(*dys):
            return mpi_ops._grouped_allreduce(mpi_ops._zeros_for_none(dys, xs), op=op,
                                              prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                              ignore_name_scope=True, process_set=process_set)

        return outs, grad

    return list(mpi_ops._apply(fwd, *tensors))
