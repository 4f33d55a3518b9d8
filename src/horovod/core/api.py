"""The op layer's public names that every binding re-exports, declared once.

``horovod.torch``, ``horovod.tensorflow``, ``horovod.keras``, ``horovod.tensorflow.keras``, ``horovod.numpy``
(and the bindings' ``mpi_ops`` modules) each expose these, as upstream's do: ``init`` and ``shutdown``, who am
I, what was built and what is enabled, the timeline, the process sets, the reduction ops and the errors a
program catches. A binding takes them with ``from horovod.core.api import *`` and then defines its own
collectives; one that needs its own form of a name (``horovod.torch``'s ``init`` also resets its handles)
defines it after the import.
"""
from __future__ import annotations

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.types import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from horovod.core.basics import (
    add_process_set,
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
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from horovod.core.process_sets import ProcessSet, global_process_set

__all__ = [
    # start and stop, who am I, what was built and is enabled, the timeline
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline",
    "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    # the process sets
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # the reduction ops and their type
    "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    # the errors a program catches around collectives (elastic training restarts on these)
    "HorovodInternalError", "HostsUpdatedInterrupt",
]
