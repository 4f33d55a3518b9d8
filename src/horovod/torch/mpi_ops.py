"""``horovod.torch`` collectives on torch tensors, with upstream's names, signatures and autograd rules.

CPU tensors are exchanged zero-copy: the op layer works on ``tensor.numpy()`` views of the tensors' own memory
(bfloat16 through an int16 view, since numpy has no native bfloat16). CUDA tensors of a job on one host go GPU
to GPU through CUDA IPC (docs/gpu.md), others are staged through host memory. Every collective is asynchronous
underneath: ``*_async`` returns an integer handle for ``poll`` and ``synchronize``; the plain forms wait.

This module is the import path upstream's programs use; the work is in ``horovod.torch.tensors`` (tensors to
numpy and back), ``horovod.torch.handles`` (the integer handles), ``horovod.torch.async_ops`` (the asynchronous
collectives) and ``horovod.torch.autograd_ops`` (the blocking and differentiable ones). The op layer's common
names (``size``, ``rank``, process sets, reduce ops ...) come from ``horovod.core.api``.
"""
from __future__ import annotations

from horovod.common.util import get_average_backwards_compatibility_fun  # noqa: F401  (upstream's mpi_ops has it)
from horovod.core import api, basics, ops
from horovod.core.api import *  # noqa: F403  (the op layer's public names, re-exported as upstream's mpi_ops does)
from horovod.core.engine.handles import Handle  # noqa: F401  (importable from here before the split)
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch import async_ops, autograd_ops
from horovod.torch.async_ops import *  # noqa: F403  (the asynchronous collectives: async_ops.__all__)
from horovod.torch.async_ops import handle_average_backwards_compatibility, process_set_size  # noqa: F401
from horovod.torch.autograd_ops import *  # noqa: F403  (the blocking and differentiable ones: autograd_ops.__all__)
from horovod.torch.autograd_ops import (  # noqa: F401  (the autograd Functions, importable from here as upstream's)
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllgather,
    HorovodGroupedAllreduce,
    HorovodGroupedReducescatter,
    HorovodReducescatter,
)
from horovod.torch.compression import Compression  # noqa: F401  (re-exported)
from horovod.torch.handles import handle_map, poll, synchronize

# Upstream's ``_HorovodBasics`` instance of the loaded extension: its private helpers
# (``_get_process_set_ids_and_ranks``, ``_process_set_size`` ...) are the op layer's basics here.
_basics = basics

# What ``from horovod.torch.mpi_ops import *`` (and so ``horovod.torch``) exports: the op layer's names (with
# this module's ``init``, ``shutdown`` and timeline functions) and the collectives.
__all__ = api.__all__ + async_ops.__all__ + autograd_ops.__all__ + ["join", "barrier", "poll", "synchronize"]


def init(*args, **kwargs) -> None:
    """Start Horovod (see ``horovod.core.basics.init``); also resets this binding's handle map."""
    handle_map.clear()
    basics.init(*args, **kwargs)


def shutdown(*args, **kwargs) -> None:
    """Stop Horovod; pending handles fail with the shutdown error."""
    handle_map.clear()
    basics.shutdown()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline to ``file_path`` (needs HOROVOD_TIMELINE, e.g. DYNAMIC, at start)."""
    basics.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording the timeline."""
    basics.stop_timeline()


def join(device: int = -1, process_set: ProcessSet = global_process_set) -> int:
    """Wait until every rank (of ``process_set``) has joined; returns the last rank to join, a global rank, the
    same on every rank.

    While joined, this rank contributes zeros to the other ranks' allreduces.
    """
    return ops.join_async(process_set).wait()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank has reached the barrier."""
    ops.barrier_async(process_set).wait()
