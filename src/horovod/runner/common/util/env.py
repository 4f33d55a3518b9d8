"""Which environment variables the launcher may forward on a command line, and rank/size from the env.

Local workers simply inherit the launcher's environment. For remote hosts the launcher has to put the variables
on the ``ssh`` command line, and some must never travel that way: shell functions (``BASH_FUNC_*``), ``OLDPWD``,
anything ending in ``CUDA_VISIBLE_DEVICES`` (each host has its own GPUs) and the job secret
``_HOROVOD_SECRET_KEY``, which goes to remote workers only through ssh's stdin.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Mapping, Optional, Tuple

from horovod.common.wire import SECRET_ENV

# Upstream's list (``horovod/runner/common/util/env.py``), plus the CUDA rule that upstream applies in gloo_run.
IGNORE_REGEXES = ("BASH_FUNC_.*", "OLDPWD", re.escape(SECRET_ENV), ".*CUDA_VISIBLE_DEVICES")

_IGNORE = re.compile("|".join(f"(?:{r})" for r in IGNORE_REGEXES))
_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_exportable(name: str) -> bool:
    """True when ``name`` may be forwarded to a worker on a command line."""
    return _IGNORE.fullmatch(name) is None and _VALID_NAME.match(name) is not None


def exportable_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The subset of ``env`` that may be forwarded on a command line (never contains the secret)."""
    return {k: v for k, v in env.items() if is_exportable(k)}


def get_env_rank_and_size(env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, int]]:
    """(rank, size) from HOROVOD_*, then Open MPI's OMPI_COMM_WORLD_*, then PMI_*; None when none is set."""
    env = os.environ if env is None else env
    for rank_var, size_var in (
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ):
        rank, size = env.get(rank_var), env.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return None
