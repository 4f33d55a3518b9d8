"""Small helpers that upstream's ``horovod.common.util`` offers and users' code imports."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from typing import Any, Callable, Iterator, List, Optional, Sequence

from horovod.common import build
from horovod.common.types import ReduceOp

log = logging.getLogger(__name__)


@contextlib.contextmanager
def env(**kwargs: str) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block (tests use it)."""
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_average_backwards_compatibility_fun(reduce_ops):
    """Resolve upstream's deprecated ``average=`` argument against ``op=``."""

    def impl(op: Optional[ReduceOp], average: Optional[bool]) -> ReduceOp:
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            log.warning("Parameter `average` has been replaced with `op` and will be removed in v1.0")
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average

    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a power of two (Adasum's requirement)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(items: Sequence, num_parts: int) -> List[List]:
    """Split ``items`` into ``num_parts`` contiguous parts whose sizes differ by at most one."""
    d, r = divmod(len(items), num_parts)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(num_parts)]


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Compare two version strings with packaging's rules."""
    from packaging.version import Version

    return Version(ver) >= Version(target)


def _cache(f: Callable) -> Callable:
    """Memoize ``f`` on its (hashable) arguments, as upstream's decorator of the same name."""
    return functools.lru_cache(maxsize=None)(f)


def is_iterable(x: Any) -> bool:
    """True when ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


# Upstream asks its compiled extensions what they were built with. Here every binding is pure Python on one core,
# so "built" means the binding's framework can be imported, and the capabilities are the core's.
_FRAMEWORKS = {"horovod.torch": "torch", "horovod.tensorflow": "tensorflow", "horovod.mxnet": "mxnet",
               "horovod.jax": "jax", "horovod.keras": "keras", "horovod.tensorflow.keras": "tensorflow"}


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True when the binding ``ext_base_name`` (for example ``'horovod.torch'``) can be used: its framework is
    installed."""
    framework = _FRAMEWORKS.get(ext_base_name)
    available = framework is not None and importlib.util.find_spec(framework) is not None
    if verbose and not available:
        log.info("Extension %s has not been built: %s is not installed.", ext_base_name, framework)
    return available


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args) -> None:
    """Upstream's check that a compiled extension was built (ImportError naming ``ext_env_var`` otherwise). There
    is nothing compiled here, so it checks that the binding's framework can be imported."""
    if ext_name in _FRAMEWORKS and not extension_available(ext_name):
        raise ImportError(f"Extension {ext_name} has not been built: {_FRAMEWORKS[ext_name]} is not installed. "
                          f"Install it (pip install \"horovod[{_FRAMEWORKS[ext_name]}]\").")


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether ``ext_base_name``'s binding reduces GPU tensors on the GPU: ``torch`` when torch is loaded and sees
    a GPU (the CUDA IPC plane, docs/gpu.md); False for the others, whose GPU tensors are staged through host memory."""
    available = ext_base_name.split(".")[-1] == "torch" and build.cuda_built()
    if verbose and not available:
        log.info("Extension %s has no GPU data path here: its GPU tensors are staged through host memory.",
                 ext_base_name)
    return available


def mpi_built(verbose: bool = False) -> bool:
    """True when mpi4py is installed, so jobs can run on MPI."""
    return build.mpi_built()


def gloo_built(verbose: bool = False) -> bool:
    """True: the built-in controller and data planes take Gloo's role."""
    return build.gloo_built()


def nccl_built(verbose: bool = False) -> int:
    """The NCCL version as upstream's integer, or 0 when there is none."""
    return build.nccl_built()


def ddl_built(verbose: bool = False) -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built(verbose: bool = False) -> bool:
    """False: Intel oneCCL is not supported."""
    return False
