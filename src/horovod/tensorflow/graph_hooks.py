"""TF1 graph-mode helpers: ``broadcast_global_variables`` and ``BroadcastGlobalVariablesHook``.

They start every rank from rank ``root_rank``'s initial (or restored) variables in a ``tf.compat.v1`` program
built as a graph and run by a ``Session`` or ``MonitoredTrainingSession``. In TensorFlow 2 code use
``hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)`` instead.
"""
from __future__ import annotations

import tensorflow as tf

from horovod.tensorflow.functions import broadcast_variables


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """An op that overwrites every global variable (``tf.compat.v1.global_variables()``) with ``root_rank``'s
    value, in one fused exchange. Graph mode only."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    with tf.name_scope("HorovodBroadcastGlobalVariables"):
        return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A ``SessionRunHook`` that broadcasts the global variables from ``root_rank`` once the session exists (after
    initialization or a checkpoint restore), so all ranks start from the same state.

    Pass it to ``tf.compat.v1.train.MonitoredTrainingSession(hooks=[...])``. ``device`` is accepted for
    compatibility: the exchange goes through host memory.
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord) -> None:
        session.run(self.bcast_op)
