"""``horovodrun --jsrun``: start the ranks with IBM's ``jsrun`` inside an LSF job (upstream's ``js_run.py``).

jsrun (IBM Job Step Manager, on Summit-class machines) starts the ranks on the job's compute hosts through LSF,
without ssh, as Spectrum MPI processes; each rank runs Horovod's MPI controller (``HOROVOD_CONTROLLER=mpi``).
The placement comes from an explicit resource file (``--erf_input``, written by
:func:`generate_jsrun_rankfile`: each rank gets its host and an equal share of the host's logical CPUs, all
GPUs visible), unless ``--binding-args`` gives jsrun's own resource flags instead, as upstream.

The command line, as upstream builds it::

    jsrun --erf_input RANKFILE [--stdio_stderr F --stdio_stdout F] [--smpiargs "-tcp EXTRA"] COMMAND...

Differences from upstream: the argv is a list run as a child process (not a ``/bin/sh -c`` string replacing
horovodrun), so stop signals are forwarded and the exit status comes back as in MPI mode; ``--smpiargs``
carries ``-tcp`` (``--tcp``) and ``--mpi-args`` only: jsrun implies Spectrum MPI, so ``mpirun`` is not probed.
jsrun passes its own environment to the ranks: the job's variables are set there (never the job secret, except
for ``horovod.run``'s workers, which need it to reach the launcher's store).
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import mpi_run
from .common.util.settings import Settings
from .process import _die_with_parent_fn, restore_signal_handlers
from .util.lsf import LSFUtils

log = logging.getLogger(__name__)

NOT_INSTALLED = (
    "horovodrun --jsrun needs the jsrun command, and none was found on PATH. Run on an LSF cluster with jsrun "
    "(IBM Job Step Manager), or pick another launcher: --mpi, or no controller flag for the built-in one."
)


class JsrunError(mpi_run.MpirunError):
    """``jsrun`` exited with a non-zero status (it reports which task failed itself); ``returncode`` and
    ``exit_code`` (horovodrun's status) as for mpirun."""


def find_jsrun(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The path of ``jsrun`` on ``PATH`` (of ``env``, else this process's), or None."""
    return shutil.which("jsrun", path=(os.environ if env is None else env).get("PATH"))


def is_jsrun_installed() -> bool:
    """True when ``jsrun`` is on ``PATH`` (upstream's helper of this name)."""
    return find_jsrun() is not None


def _validated_hosts(settings: Settings, slots_per_host: int) -> List[Tuple[str, int]]:
    """``settings.hosts`` cut to ``settings.num_proc`` ranks, each host's count checked against the node."""
    chosen: List[Tuple[str, int]] = []
    remaining = settings.num_proc
    for entry in settings.hosts.split(","):
        host, slots = entry.rsplit(":", 1)
        if int(slots) > slots_per_host:
            raise ValueError(f"Invalid host input, slot count for host '{host}:{slots}' is greater than the "
                             f"number of ranks a node takes ({slots_per_host}): lower it in -H/--hostfile.")
        needed = min(int(slots), remaining)
        chosen.append((host, needed))
        remaining -= needed
        if remaining == 0:
            break
    if remaining:
        raise ValueError(f"Not enough slots on the hosts to fulfill the {settings.num_proc} requested: add "
                         "hosts or slots with -H/--hostfile, or lower -np.")
    return chosen


def rankfile_text(settings: Settings, cores: int, threads: int, slots_per_host: int) -> str:
    """The explicit resource file for ``settings``: ranks in host order, each with ``cores * threads //
    slots_per_host`` logical CPUs of its host (upstream's layout), every GPU and all memory."""
    cpu_per_rank = max(1, (cores * threads) // slots_per_host)
    lines = ["overlapping_rs: allow", "cpu_index_using: logical"]
    rank = 0
    for host, slots in _validated_hosts(settings, slots_per_host):
        lines.append("")
        for local in range(slots):
            first = local * cpu_per_rank
            lines.append(f"rank: {rank}: {{ hostname: {host}; cpu: {{{first}-{first + cpu_per_rank - 1}}} ; "
                         "gpu: * ; mem: * }")
            rank += 1
    return "\n".join(lines) + "\n"


def generate_jsrun_rankfile(settings: Settings, path: Optional[str] = None) -> str:
    """Write the rankfile for ``settings`` (to ``path``, else a new temporary file) and return its path.

    The node's cores, threads per core and ranks per node come from :class:`LSFUtils` (CSM, lscpu, LSF).
    """
    text = rankfile_text(settings, LSFUtils.get_num_cores(), LSFUtils.get_num_threads(),
                         LSFUtils.get_slots_per_host())
    if path is None:
        fd, path = tempfile.mkstemp(prefix="horovod-jsrun-", suffix=".erf")
        os.close(fd)
    with open(path, "w") as f:
        f.write(text)
    return path


def build_jsrun_command(settings: Settings, command: Sequence[str], rankfile: Optional[str],
                        jsrun: str = "jsrun") -> List[str]:
    """jsrun's argv: the placement (``--binding-args``, else ``--erf_input rankfile``), the output files, the
    Spectrum MPI arguments (``-tcp`` for ``--tcp``, then ``--mpi-args``), then the command."""
    argv = [jsrun]
    if settings.binding_args:
        argv += shlex.split(settings.binding_args)
    else:
        argv += ["--erf_input", str(rankfile)]
    if settings.output_filename:
        argv += ["--stdio_stderr", settings.output_filename, "--stdio_stdout", settings.output_filename]
    smpiargs = (["-tcp"] if settings.tcp_flag else []) + ([settings.extra_mpi_args] if settings.extra_mpi_args
                                                          else [])
    if smpiargs:
        argv += ["--smpiargs", " ".join(smpiargs)]
    return argv + list(command)


def jsrun_env(settings: Settings, nics: Optional[Sequence[str]], env: Mapping[str, str],
              export_secret: bool = False) -> Dict[str, str]:
    """jsrun's environment, which it passes on to the ranks: ``env`` with the MPI controller selected."""
    out = mpi_run.mpirun_env(env, export_secret)
    out["HOROVOD_CONTROLLER"] = "mpi"
    out.setdefault("PYTHONUNBUFFERED", "1")
    out["HOROVOD_START_TIMEOUT"] = mpi_run._number(settings.start_timeout)
    if settings.tcp_flag:
        out["NCCL_IB_DISABLE"] = "1"
    if nics and "NCCL_SOCKET_IFNAME" not in out:
        out["NCCL_SOCKET_IFNAME"] = ",".join(nics)
    return out


def js_run(settings: Settings, nics: Optional[Sequence[str]], env: Mapping[str, str], command: Sequence[str],
           export_secret: bool = False, stdin: Optional[int] = None,
           grace: float = mpi_run.STOP_GRACE_SECONDS) -> None:
    """Run ``command`` on ``settings.num_proc`` ranks with jsrun and wait for it (upstream's ``js_run``).

    Raises ValueError when jsrun is missing or the hosts do not fit, :class:`JsrunError` when jsrun exits
    non-zero, KeyboardInterrupt / JobInterruptedError when horovodrun was stopped (forwarded to jsrun first).
    """
    jsrun = find_jsrun(env)
    if jsrun is None:
        raise ValueError(NOT_INSTALLED)
    rankfile = None if settings.binding_args else generate_jsrun_rankfile(settings)
    try:
        if rankfile and settings.verbose:
            with open(rankfile) as f:
                log.info("jsrun rankfile %s:\n%s", rankfile, f.read())
        argv = build_jsrun_command(settings, command, rankfile, jsrun)
        if settings.verbose:
            log.info("Executing: %s", shlex.join(argv))
        _execute(argv, jsrun_env(settings, nics, env, export_secret), command, stdin, grace)
    finally:
        if rankfile:
            os.unlink(rankfile)


def _execute(argv: List[str], env: Mapping[str, str], command: Sequence[str], stdin: Optional[int],
             grace: float) -> None:
    """Run jsrun (its output goes straight to the console), forwarding stop signals to it."""
    try:
        proc = subprocess.Popen(argv, env=dict(env), stdin=stdin, start_new_session=True,
                                preexec_fn=_die_with_parent_fn())
    except OSError as exc:
        raise ValueError(f"Could not start {argv[0]}: {exc.strerror or exc}. {NOT_INSTALLED}") from exc
    received: List[int] = []
    previous = mpi_run._install_forwarding(proc, received)
    try:
        returncode = mpi_run._wait(proc, received, grace)
    finally:
        restore_signal_handlers(previous)
    if received:
        mpi_run._raise_interrupted(received[0])
    if returncode != 0:
        raise JsrunError(returncode, f"jsrun exited with code {returncode} (see its report above for the task "
                                     f"that failed). Command: {shlex.join(command)}")
