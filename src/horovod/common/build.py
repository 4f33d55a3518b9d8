"""What this build can do: upstream's ``*_built()`` answers, which need no running job.

They sit in the shared ground so that ``horovod.common.util`` (an upstream import path) and the op layer's
``basics`` can both give them without the shared ground importing upward.
"""
from __future__ import annotations

from horovod.common import mpi_context


def mpi_built() -> bool:
    """True when mpi4py is installed, so that Horovod can run on MPI (the check does not initialize MPI)."""
    return mpi_context.mpi4py_available()


def gloo_built() -> bool:
    """True: the built-in controller and data plane take Gloo's role."""
    return True


def nccl_built() -> int:
    """0: this build has no NCCL data plane (GPU tensors are staged through host memory, see docs/torch.md)."""
    return 0


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: Intel oneCCL is not supported."""
    return False


def cuda_built() -> bool:
    """False: no CUDA kernels are built (there is nothing to build)."""
    return False


def rocm_built() -> bool:
    """False: no ROCm kernels are built."""
    return False
