"""``horovodrun`` inside a Slurm allocation: start the ranks as one ``srun`` step (no ssh), as Open MPI's
``mpirun`` does under Slurm.

When ``horovodrun`` runs in the shell of ``salloc`` or in an ``sbatch`` script and is given no hosts (no
``-H``/``--hostfile``, no discovery script), the hosts and slots come from the allocation
(:mod:`horovod.runner.util.slurm`), ``-np`` defaults to its task count, and the ranks start as::

    SLURM_HOSTFILE=<one host per rank> srun --ntasks=N --distribution=arbitrary --kill-on-bad-exit=1 --label \
        --quit-on-interrupt python -m horovod.runner.srun_task COMMAND...

``--distribution=arbitrary`` places rank ``r`` on the host of line ``r`` of the host file, so each node runs the
tasks of the plan (hosts filled in allocation order). Each task sets its ``HOROVOD_*`` rank variables from
Slurm's (:mod:`horovod.runner.srun_task`) and becomes the command. srun passes its own environment on to the
tasks: the rendezvous address and the job secret travel there (over Slurm's munge-authenticated RPC), never on
a command line. ``--label`` tags each line with the task id; the launcher turns the tags into the usual
``[rank]<stdout>:`` prefixes. ``--kill-on-bad-exit`` makes srun stop every task when one fails; the launcher
reads srun's ``task N: Exited with exit code C`` report and raises :class:`JobFailedError` naming that rank.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from horovod.common.wire import SECRET_ENV

from . import mpi_run
from .common.util import network
from .common.util.hosts import SlotInfo
from .common.util.settings import Settings
from .gloo_run import RANK_VARIABLES, host_alloc_plan, job_env
from .mpi_output import MpirunOutput
from .process import (
    GRACE_SECONDS,
    JobFailedError,
    JobInterruptedError,
    OutputSink,
    WorkerStartError,
    _die_with_parent_fn,
    describe_returncode,
)
from .rendezvous import RendezvousServer
from .srun_task import HOSTFILE_ENV
from .util import slurm

log = logging.getLogger(__name__)

NOT_INSTALLED = ("horovodrun runs inside a Slurm allocation (SLURM_JOB_ID is set) but srun is not on PATH: load "
                 "Slurm's module (or add its bin directory to PATH), or give the hosts with -H/--hostfile to "
                 "start the ranks over ssh.")

# ``srun: error: node1: task 1: Exited with exit code 3`` / ``srun: error: node1: tasks 0,2-3: Killed``
_TASK_EXIT = re.compile(r"srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+?)\s*$")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
# srun --label tags every line of a task with its id: ``3: text`` (right-aligned for wider jobs).
_LABEL = re.compile(r"^\s*(\d+): ?")
# slurmstepd writes its own notices into a task's stream (``slurmstepd-node1: error: *** STEP 6.0 ...``).
_STEPD = re.compile(r"^slurmstepd(?:-\S+)?: ")
_SIGNAL_TEXT = {signal.strsignal(s): -int(s) for s in signal.Signals if signal.strsignal(s)}
_SIGNAL_TEXT.update({"Killed": -int(signal.SIGKILL), "Terminated": -int(signal.SIGTERM)})


class SrunError(mpi_run.MpirunError):
    """srun exited with a non-zero status and named no failed task; ``returncode`` and ``exit_code``."""


def wanted(args: Any, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``args`` describe a job that starts with srun: inside a Slurm allocation, a command (not
    ``horovod.run``), no hosts given, not elastic, not ``--mpi``/``--jsrun`` (mpirun reads Slurm itself)."""
    if not slurm.using_slurm(env):
        return False
    given = ("hosts", "hostfile", "host_discovery_script", "min_np", "use_mpi", "use_jsrun", "run_func")
    return not any(getattr(args, name, None) for name in given)


def apply_allocation(args: Any, env: Optional[Mapping[str, str]] = None) -> None:
    """Default ``-np`` and the hosts to the allocation's, and mark the job to start with srun."""
    if not getattr(args, "np", None):
        args.np = slurm.num_processes(env)
    args.hosts = slurm.hosts_string(env)
    args.slurm_step = True
    log.info("Slurm job %s: hosts %s", (os.environ if env is None else env).get("SLURM_JOB_ID"), args.hosts)


def hostfile_text(plan: Sequence[SlotInfo]) -> str:
    """The ``SLURM_HOSTFILE`` for ``--distribution=arbitrary``: the host of each rank, one per line in order."""
    return "".join(f"{slot.hostname}\n" for slot in plan)


def build_srun_command(num_proc: int, command: Sequence[str], srun: str = "srun",
                       python: Optional[str] = None) -> List[str]:
    """srun's argv: one step of ``num_proc`` tasks placed by the host file, labelled output, fail-fast, a single
    SIGINT ending the step (srun's default only prints its status); each task runs
    :mod:`horovod.runner.srun_task`, which sets its rank variables and becomes ``command``."""
    return [srun, f"--ntasks={num_proc}", "--distribution=arbitrary", "--kill-on-bad-exit=1", "--label",
            "--quit-on-interrupt", python or sys.executable, "-m", "horovod.runner.srun_task", "--", *command]


def srun_env(base_env: Mapping[str, str], common_env: Mapping[str, str], secret: str,
             hostfile: str) -> dict:
    """srun's environment, which it passes on to every task: the launcher's with the job's variables, the
    secret and the placement file. Rank variables a surrounding launcher left are dropped (each task sets
    its own)."""
    env = {k: v for k, v in base_env.items() if k not in RANK_VARIABLES}
    env.update(common_env)
    env[SECRET_ENV] = secret
    env[HOSTFILE_ENV] = hostfile
    return env


class SrunOutput(MpirunOutput):
    """srun's output: task lines (``N: text``) re-prefixed ``[N]<stream>:``, srun's and slurmstepd's own lines
    passed through unchanged and remembered for the failure report."""

    def __init__(self, num_proc: int, output_dir: Optional[str], prefix_timestamp: bool = False) -> None:
        super().__init__(num_proc, output_dir, None, None)
        self._sink = OutputSink(prefix_timestamp=prefix_timestamp)

    def _line(self, raw: bytes, stream: str) -> None:
        text = raw.decode("utf-8", "replace")
        shown = text.rstrip("\r\n")
        match = _LABEL.match(shown)
        if match is None or _STEPD.match(shown[match.end():]):
            content = shown if match is None else shown[match.end():]
            self._record(content + "\n", stream, None, stream, content, content)
            return
        rank, content = int(match.group(1)), shown[match.end():]
        self._record(self._sink.format(rank, stream, content + "\n"), stream, rank, stream, content, content)


def first_failure(srun_lines: Sequence[str]) -> Optional[Tuple[int, str, int]]:
    """The first task srun reported as failed: (rank, host, return code as Popen gives it), or None."""
    for line in srun_lines:
        match = _TASK_EXIT.search(line)
        if match is None:
            continue
        rank = int(re.split(r"[,\-]", match.group("tasks"))[0])
        what = match.group("what")
        code = _EXIT_CODE.search(what)
        returncode = int(code.group(1)) if code else _SIGNAL_TEXT.get(what, 1)
        return rank, match.group("host"), returncode
    return None


def _rendezvous_addr(plan: Sequence[SlotInfo], nics: Optional[Sequence[str]]) -> str:
    remote = network.filter_local_addresses(list(dict.fromkeys(slot.hostname for slot in plan)))
    return network.get_driver_ip(nics, remote) if remote or nics else "127.0.0.1"


def launch(settings: Settings, env: Mapping[str, str], command: Sequence[str],
           grace: float = GRACE_SECONDS) -> None:
    """Run ``command`` on ``settings.num_proc`` ranks as one srun step and wait for it.

    Raises ValueError when srun is missing, :class:`JobFailedError` naming the first rank that failed,
    :class:`SrunError` when srun failed without naming one, KeyboardInterrupt / JobInterruptedError when
    horovodrun was stopped (forwarded to srun, which stops the tasks).
    """
    srun = shutil.which("srun", path=env.get("PATH"))
    if srun is None:
        raise ValueError(NOT_INSTALLED)
    plan = host_alloc_plan(settings)
    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    fd, hostfile = tempfile.mkstemp(prefix="horovod-srun-", suffix=".hosts")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(hostfile_text(plan))
        rendezvous.init(plan)
        common = job_env(_rendezvous_addr(plan, settings.nics), rendezvous.port, settings)
        argv = build_srun_command(settings.num_proc, command, srun)
        if settings.verbose:
            log.info("Executing: %s (placement: %s)", shlex.join(argv), settings.hosts)
        if settings.output_filename:
            os.makedirs(settings.output_filename, exist_ok=True)
        _execute(argv, srun_env(env, common, rendezvous.secret, hostfile), command, settings, grace)
    finally:
        os.unlink(hostfile)
        rendezvous.stop()


def _execute(argv: List[str], env: Mapping[str, str], command: Sequence[str], settings: Settings,
             grace: float) -> None:
    """Run srun with its output relabelled, forwarding stop signals; raise for a failed job."""
    try:
        proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent_fn())
    except OSError as exc:
        raise WorkerStartError(f"Could not start {argv[0]}: {exc.strerror or exc}. {NOT_INSTALLED}") from exc
    output = SrunOutput(settings.num_proc, settings.output_filename, settings.prefix_output_with_timestamp)
    received: List[int] = []
    returncode = mpi_run._run_to_completion(proc, output, received, grace)
    if received:
        log.error("Received %s: srun ended the job step.", signal.Signals(received[0]).name)
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise JobInterruptedError(received[0])
    if returncode == 0:
        return
    failure = first_failure(list(output.untagged["stderr"]) + list(output.untagged["stdout"]))
    if failure is None:
        raise SrunError(returncode, f"srun exited with code {returncode} and named no failed task (see its "
                                    f"messages above). Command: {shlex.join(command)}")
    rank, host, code = failure
    log.error("Process %d failed (%s) on %s. srun stopped the remaining tasks.", rank, describe_returncode(code),
              host)
    raise JobFailedError(output.exit_info(rank, host, code, shlex.join(command)))
