"""What this build can do: upstream's ``*_built()`` answers, which need no running job.

They sit in the shared ground so that ``horovod.common.util`` (an upstream import path) and the op layer's
``basics`` can both give them without the shared ground importing upward.
"""
from __future__ import annotations

import sys

from horovod.common import mpi_context


def mpi_built() -> bool:
    """True when mpi4py is installed, so that Horovod can run on MPI (the check does not initialize MPI)."""
    return mpi_context.mpi4py_available()


def gloo_built() -> bool:
    """True: the built-in controller and data plane take Gloo's role."""
    return True


def nccl_built() -> int:
    """0: there is no NCCL data plane (CUDA tensors of ranks on one host go through CUDA IPC instead, and across
    hosts they are staged through host memory; docs/gpu.md)."""
    return 0


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: Intel oneCCL is not supported."""
    return False


def cuda_built() -> bool:
    """True when CUDA tensors can be reduced on the GPU here: torch is loaded and sees a GPU (the CUDA IPC plane,
    docs/gpu.md, needs nothing built). It never imports torch itself."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:           # a torch without a working CUDA runtime
        return False


def rocm_built() -> bool:
    """False: no ROCm kernels are built."""
    return False
