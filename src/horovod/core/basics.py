"""Process-wide basics, as one module: ``init``/``shutdown``, who am I, what this build can do, process sets.

The op layer's face of three modules, with upstream's basics' names (``horovod.common.basics`` is this module):

- :mod:`horovod.core.bootstrap`: ``init``, ``shutdown``, the timeline;
- :mod:`horovod.core.process_set_registry`: ``add_process_set``, ``remove_process_set``, a set's engine and ranks;
- :mod:`horovod.core.queries`: ``rank``, ``size``, ``local_rank`` ..., the data plane, what is built and enabled;

on the job state they share (:mod:`horovod.core.job_state`). The names are those modules' own objects, so
reading them here reads the real ones; to patch one (in a test), patch it where it is defined.
"""
from horovod.core.bootstrap import init, shutdown, start_timeline, stop_timeline
from horovod.core.job_state import engine
from horovod.core.job_state import state as _state  # noqa: F401  (read by tests and benchmarks)
from horovod.core.process_set_registry import (
    _get_process_set_ids_and_ranks,
    _process_set_rank,
    _process_set_size,
    add_process_set,
    engine_for,
    process_set_ranks,
    registered_set,
    remove_process_set,
)
from horovod.core.queries import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    data_plane,
    ddl_built,
    generation,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
)

__all__ = [
    "init", "shutdown", "start_timeline", "stop_timeline", "engine",
    "add_process_set", "remove_process_set", "engine_for", "process_set_ranks", "registered_set",
    "_get_process_set_ids_and_ranks", "_process_set_rank", "_process_set_size",
    "generation", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "data_plane", "mpi_enabled", "mpi_threads_supported", "gloo_enabled",
    "mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
]
