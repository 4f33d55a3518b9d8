"""Where the ranks' flight records go, for every layer: the library writes them, the launcher names them, and
``python -m horovod.timeline flight`` reads them.

Each rank writes one file, ``rank.<global rank>.json``, into one folder per job: ``HOROVOD_FLIGHT_RECORDER_DIR``
when set, else ``./horovod-flight/<job id>``. ``horovodrun`` chooses the folder once per job
(:func:`new_job_folder`) and hands it to every rank in the environment, so that all of them agree; a rank started
without it (a plain ``mpirun`` or ``srun``) names the folder after its launcher's job id (:func:`default_folder`).

The recorder itself lives above the engine (``horovod.core.observers.flight_recorder``); layers below it (the
engine, the data planes) ask for a dump through :func:`request_dump`, which the recorder serves once it is
loaded.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import time
from typing import Callable, Dict, Mapping, Optional

from horovod.common import config

log = logging.getLogger(__name__)

ROOT_NAME = "horovod-flight"
FORMAT = "horovod-flight-record"
VERSION = 1
DIR_ENV = "HOROVOD_FLIGHT_RECORDER_DIR"
SIZE_ENV = "HOROVOD_FLIGHT_RECORDER_SIZE"
_FILE = re.compile(r"rank\.(\d+)\.json")
# Job ids that every rank of one launch shares, most specific first (Open MPI/PRRTE, Slurm, LSF, MPICH's hydra).
_JOB_IDS = (("PMIX_NAMESPACE",), ("OMPI_MCA_orte_ess_jobid",), ("SLURM_JOB_ID", "SLURM_STEP_ID"), ("LSB_JOBID",),
            ("PMI_KVSNAME",))

Dumper = Callable[[str, str], Optional[str]]
_dumper: Optional[Dumper] = None


def file_name(rank: int) -> str:
    """The name of a rank's record in the job's folder."""
    return f"rank.{rank}.json"


def record_files(folder: str) -> Dict[int, str]:
    """The records in ``folder``, by global rank (empty when there is none, or no such folder)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = _FILE.fullmatch(name)
        if match is not None:
            found[int(match.group(1))] = os.path.join(folder, name)
    return dict(sorted(found.items()))


def enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the ranks keep a flight record (HOROVOD_FLIGHT_RECORDER_SIZE is not 0)."""
    return config.get(SIZE_ENV, env) > 0


def new_job_folder(base: Optional[str] = None) -> str:
    """A fresh folder name for one job's records (not created): ``<base>/horovod-flight/<date>-<time>-<hex>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(os.path.abspath(base or os.getcwd()), ROOT_NAME, f"{stamp}-{secrets.token_hex(2)}")


def _job_id(env: Mapping[str, str]) -> Optional[str]:
    for names in _JOB_IDS:
        values = [env.get(name) for name in names]
        if values[0]:
            text = ".".join(v for v in values if v)
            return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or None
    return None


def default_folder(env: Optional[Mapping[str, str]] = None) -> str:
    """This rank's folder: HOROVOD_FLIGHT_RECORDER_DIR, else ``./horovod-flight/<job id>`` with the launcher's job id
    (ranks of one host started by one launcher without one share its process id)."""
    env = os.environ if env is None else env
    chosen = config.get(DIR_ENV, env)
    if chosen:
        return os.path.abspath(chosen)
    job = _job_id(env) or f"{time.strftime('%Y%m%d')}-ppid{os.getppid()}"
    return os.path.join(os.getcwd(), ROOT_NAME, job)


def set_dumper(dumper: Optional[Dumper]) -> None:
    """Install the function that writes this process's records (the recorder does, when it is loaded)."""
    global _dumper
    _dumper = dumper


def request_dump(reason: str, detail: str = "") -> Optional[str]:
    """Write this process's flight records (for layers below the recorder, such as a data-plane watchdog): the
    folder written, or None when no recorder is loaded or nothing could be written. Never raises."""
    dumper = _dumper
    if dumper is None:
        return None
    try:
        return dumper(reason, detail)
    except Exception:       # a diagnostic must never take the job down with it
        log.debug("the flight recorder failed to write", exc_info=True)
        return None
