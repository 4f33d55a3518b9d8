"""The None-gradient check on the op layer, shared by the TensorFlow and Keras bindings: the collectives that
``horovod.common.gradient_presence.none_gradient_verdict`` needs, run as blocking host calls."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from horovod.common import gradient_presence as presence
from horovod.common.types import ReduceOp
from horovod.core import ops
from horovod.core.process_sets import ProcessSet


def verdict_on_host(vector: np.ndarray, labels: Sequence[str], name: str, process_set: ProcessSet, who: str,
                    remedy: str) -> Optional[str]:
    """``gradient_presence.none_gradient_verdict`` on the op layer: a blocking Sum allreduce named
    ``<name>.gradients_present`` (the fast round where it applies) and, only on a partial gradient, an allgather
    ``<name>.gradients_present.ranks``."""
    def allreduce_sum(array: np.ndarray) -> np.ndarray:
        with ops.blocking():
            handle = ops.allreduce_async(array, None, f"{name}.gradients_present", ReduceOp.SUM,
                                         process_set=process_set)
        return handle.wait()

    def allgather(flags: np.ndarray) -> np.ndarray:
        with ops.blocking():
            return ops.allgather_async(flags, f"{name}.gradients_present.ranks", process_set=process_set).wait()

    return presence.none_gradient_verdict(vector, labels, ops.set_ranks(process_set), allreduce_sum, allgather, who,
                                          remedy)
