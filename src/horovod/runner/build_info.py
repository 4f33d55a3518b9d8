"""What this installation can run, for ``horovodrun --check-build``.

Each framework is checked by importing it in a separate interpreter (in parallel), so a broken install shows as
unavailable and nothing heavy is imported into the launcher. Normal launches never run these checks.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict

# name shown -> (top-level module, python snippet that must print "1" when usable)
_PROBES = {
    "TensorFlow": ("tensorflow", "import tensorflow; print(1)"),
    "PyTorch": ("torch", "import torch; print(1)"),
    "MXNet": ("mxnet", "import mxnet; print(1)"),
    "JAX": ("jax", "import jax; print(1)"),
    "MPI": ("mpi4py", "import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False; "
                      "from mpi4py import MPI; print(1)"),
    # No NCCL plane exists (docs/gpu.md): the answer is the library's own, never torch's NCCL.
    "NCCL": ("horovod", "from horovod.common.build import nccl_built; print(int(bool(nccl_built())))"),
}


@dataclasses.dataclass
class BuildInfo:
    """Availability of each framework, controller and tensor-operation backend."""

    tensorflow: bool
    torch: bool
    mxnet: bool
    jax: bool
    mpi: bool
    gloo: bool
    nccl: bool
    ddl: bool
    ccl: bool


# Framework -> this project's binding module; a framework counts only when its binding ships too.
_BINDINGS = {"TensorFlow": "horovod.tensorflow", "PyTorch": "horovod.torch", "MXNet": "horovod.mxnet",
             "JAX": "horovod.jax"}


def _binding_present(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None   # a bare folder (namespace package) is no binding


def _probe(module: str, snippet: str, timeout: float = 120.0) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    try:
        result = subprocess.run([sys.executable, "-c", snippet], stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=timeout, text=True)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip().endswith("1")


def detect() -> BuildInfo:
    """Probe everything (a few seconds when large frameworks are installed)."""
    from horovod.common import build

    probes = {name: probe for name, probe in _PROBES.items()
              if name not in _BINDINGS or _binding_present(_BINDINGS[name])}
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        futures = {name: pool.submit(_probe, module, snippet) for name, (module, snippet) in probes.items()}
        found: Dict[str, bool] = {name: futures[name].result() if name in futures else False for name in _PROBES}
    # MPI counts when mpi4py is installed (build.mpi_built) and its MPI library loads (the probe).
    found["MPI"] = found["MPI"] and build.mpi_built()
    return BuildInfo(
        tensorflow=found["TensorFlow"], torch=found["PyTorch"], mxnet=found["MXNet"], jax=found["JAX"],
        mpi=found["MPI"],
        gloo=True,  # the built-in controller and data planes take Gloo's role; always present
        nccl=found["NCCL"], ddl=False, ccl=False,
    )


def format_build(version: str, info: BuildInfo, verbose: bool = False) -> str:
    """Upstream's ``--check-build`` table (with JAX added to the frameworks)."""

    def mark(value: bool) -> str:
        return "X" if value else " "

    return (
        ("\n" if verbose else "")
        + f"Horovod v{version}:\n"
        "\n"
        "Available Frameworks:\n"
        f"    [{mark(info.tensorflow)}] TensorFlow\n"
        f"    [{mark(info.torch)}] PyTorch\n"
        f"    [{mark(info.mxnet)}] MXNet\n"
        f"    [{mark(info.jax)}] JAX\n"
        "\n"
        "Available Controllers:\n"
        f"    [{mark(info.mpi)}] MPI\n"
        f"    [{mark(info.gloo)}] Gloo\n"
        "\n"
        "Available Tensor Operations:\n"
        f"    [{mark(info.nccl)}] NCCL\n"
        f"    [{mark(info.ddl)}] DDL\n"
        f"    [{mark(info.ccl)}] CCL\n"
        f"    [{mark(info.mpi)}] MPI\n"
        f"    [{mark(info.gloo)}] Gloo"
    )


def format_data_planes(info: BuildInfo) -> str:
    """Which data plane a job will use by default, and why (what ``init()`` logs at INFO for the real job)."""
    from horovod.common import config

    forced = config.get("HOROVOD_CPU_OPERATIONS")
    lines = ["Default data planes (HOROVOD_CPU_OPERATIONS" + (f"={forced.lower()} forces one" if forced else
                                                              " unset") + "):",
             "    horovodrun, one host:       shm (shared memory)",
             "    horovodrun, several hosts:  hierarchical: shm inside hosts, tcp between them"]
    if info.mpi:
        def limit(name: str) -> str:
            value = config.get(name)
            return "any size" if value < 0 else f"{value} B"

        lines += [f"    MPI, one host:              mpi+shm: MPI for reductions up to "
                  f"{limit('HOROVOD_MPI_REDUCE_MAX_BYTES')} and data movement up to "
                  f"{limit('HOROVOD_MPI_MOVE_MAX_BYTES')}, shm for the rest (the faster of each, measured)",
                  "    MPI, several hosts:         hierarchical: shm inside hosts, MPI between them",
                  "    MPI without MPI_THREAD_MULTIPLE or with HOROVOD_MPI_THREADS_DISABLE: as horovodrun"]
    else:
        lines.append("    MPI:                        not available (pip install horovod[mpi])")
    return "\n".join(lines)
