"""Start the ranks, forward their output, and stop the whole job on the first failure.

Each rank runs in its own process session (so a signal to one rank's group reaches its children too, and
Ctrl-C in the terminal reaches only ``horovodrun``). Every output line is forwarded with upstream's prefix
``[<rank>]<stdout>:`` / ``[<rank>]<stderr>:`` and optionally also written, unprefixed, to
``<output_dir>/rank.<padded rank>/{stdout,stderr}``.

When a rank exits with a non-zero status, the others are stopped (SIGTERM to their process groups, SIGKILL after
a short grace; ranks that are writing their flight records get up to a second first, see flight_folder.py) and :class:`JobFailedError` names the first rank that failed, its host, its exit status and its
last output lines. SIGINT, SIGTERM or SIGHUP to the launcher stops every rank the same way.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, Iterator, List, Optional, Sequence, Tuple

from . import flight_folder
from .output_tail import OutputTail, report_lines

log = logging.getLogger(__name__)

GRACE_SECONDS = 3.0
FAILURE_HEADLINE = (
    "Horovod detected that one or more processes exited with non-zero status, thus causing the job to be "
    "terminated. The first process to do so was:"
)


@dataclasses.dataclass
class WorkerSpec:
    """How to start one rank. ``display`` is what --verbose and error reports show (never the secret)."""

    rank: int
    hostname: str
    argv: List[str]
    env: Dict[str, str]
    display: str
    stdin_data: Optional[bytes] = None
    cwd: Optional[str] = None
    command_text: str = ""
    local: bool = True          # the rank's process is the one started here (False: an ssh client starts it)


@dataclasses.dataclass
class WorkerExit:
    """How one rank ended, for the failure report."""

    rank: int
    hostname: str
    returncode: int
    command_text: str
    last_lines: List[str]
    exception: List[str] = dataclasses.field(default_factory=list)   # its last exception's first lines, if unseen

    @property
    def status(self) -> str:
        return describe_returncode(self.returncode)


def describe_returncode(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` for a Popen return code."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def format_failure(failure: WorkerExit) -> str:
    """The job-failure report: upstream's sentence, then the first failed rank, its host, status and output."""
    lines = [
        FAILURE_HEADLINE,
        f"Process name: {failure.rank}",
        f"Host: {failure.hostname}",
        f"Exit code: {failure.returncode}" + (f" ({failure.status})" if failure.returncode < 0 else ""),
        f"Command: {failure.command_text}",
    ]
    if failure.returncode == -signal.SIGKILL:
        lines.append("(A rank killed by SIGKILL that horovodrun did not kill is often the victim of the kernel's "
                     "out-of-memory killer: check `dmesg` on that host.)")
    lines.extend(report_lines(failure.rank, failure.exception, failure.last_lines))
    return "\n".join(lines)


class JobFailedError(RuntimeError):
    """A rank exited with a non-zero status; the job was stopped. ``failure`` is the first such rank."""

    def __init__(self, failure: WorkerExit, note: str = "") -> None:
        self.failure = failure
        rc = failure.returncode
        self.exit_code = rc if 0 < rc < 256 else (128 + (-rc) if rc < 0 else 1)
        super().__init__(format_failure(failure) + note)


class JobInterruptedError(RuntimeError):
    """The launcher received SIGTERM or SIGHUP and stopped every rank."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"horovodrun received {signal.Signals(signum).name}; all ranks were stopped.")


class WorkerStartError(RuntimeError):
    """A rank's process could not be started (command not found, bad working directory, ...)."""


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")


def split_lines(pipe: IO[bytes], chunk: int = 65536) -> Iterator[bytes]:
    """Raw lines of a pipe as they arrive, ending at ``\n``, ``\r\n`` *or* a lone ``\r`` (terminator kept).

    A lone carriage return ends a line too, so progress bars (tqdm) show up live, one prefixed line per update,
    instead of as one enormous line when the rank exits.
    """
    pending = b""
    fd = pipe.fileno()
    while True:
        data = os.read(fd, chunk)
        if not data:
            break
        pending += data
        end = 0
        for match in _LINE.finditer(pending):
            if match.end() == len(pending) and pending.endswith(b"\r"):
                break                       # maybe the first half of \r\n: wait for the next read
            yield match.group()
            end = match.end()
        pending = pending[end:]
    if pending:
        yield pending


def pad_rank(rank: int, size: int) -> str:
    """Zero-pad ``rank`` so that the rank directories of a job sort in rank order."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


class OutputSink:
    """Writes the ranks' lines to the console with upstream's ``[rank]<stream>:`` prefix, one line at a time."""

    def __init__(self, stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None,
                 prefix_timestamp: bool = False) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._prefix_timestamp = prefix_timestamp
        self._lock = threading.Lock()

    def format(self, rank: int, stream: str, text: str) -> str:
        stamp = time.asctime(time.localtime()) if self._prefix_timestamp else ""
        return f"{stamp}[{rank}]<{stream}>:{text}"

    def write(self, rank: int, stream: str, line: bytes) -> str:
        text = line.decode("utf-8", "replace")
        if not text.endswith("\n"):
            text += "\n"
        out = self.format(rank, stream, text)
        target = (self._stdout or sys.stdout) if stream == "stdout" else (self._stderr or sys.stderr)
        with self._lock:
            try:
                target.write(out)
                target.flush()
            except (OSError, ValueError):
                pass  # the console went away (closed pipe): keep draining so the rank never blocks
        return out


def _die_with_parent_fn():
    """A preexec_fn that makes the rank receive SIGTERM if the launcher dies without cleaning up (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


class WorkerProcess:
    """One running rank: its process, output pumps and last lines."""

    def __init__(self, spec: WorkerSpec, sink: OutputSink, events: queue.SimpleQueue,
                 out_dir: Optional[str]) -> None:
        self.spec = spec
        self.tail = OutputTail()
        self._sink = sink
        self._files: List[IO[bytes]] = []
        files: Dict[str, Optional[IO[bytes]]] = {"stdout": None, "stderr": None}
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
            for name in files:
                f = open(os.path.join(out_dir, name), "wb")
                files[name] = f
                self._files.append(f)
        try:
            self.proc = subprocess.Popen(
                spec.argv, env=spec.env, cwd=spec.cwd,
                stdin=subprocess.PIPE if spec.stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=_die_with_parent_fn(),
            )
        except OSError as exc:
            self._close_files()
            raise WorkerStartError(
                f"Could not start rank {spec.rank} on {spec.hostname}: {exc.strerror or exc} "
                f"(command: {spec.display}). Check that the program exists and is executable on that host."
            ) from exc
        if spec.stdin_data is not None:
            try:
                self.proc.stdin.write(spec.stdin_data)
                self.proc.stdin.flush()
            except OSError:
                pass  # it already exited; its exit status tells the story
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, "stdout", files["stdout"]),
                             name=f"horovodrun-rank{spec.rank}-stdout", daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, "stderr", files["stderr"]),
                             name=f"horovodrun-rank{spec.rank}-stderr", daemon=True),
        ]
        for t in self._pumps:
            t.start()
        self._waiter = threading.Thread(target=self._wait, args=(events,), name=f"horovodrun-rank{spec.rank}",
                                        daemon=True)
        self._waiter.start()

    def _pump(self, pipe: IO[bytes], stream: str, copy: Optional[IO[bytes]]) -> None:
        try:
            for raw in split_lines(pipe):
                content = raw.rstrip(b"\r\n")
                shown = self._sink.write(self.spec.rank, stream, content + b"\n")
                self.tail.add(content.decode("utf-8", "replace"), shown.rstrip("\n"), stream)
                if copy is not None:
                    copy.write(raw)
                    copy.flush()
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def _wait(self, events: queue.SimpleQueue) -> None:
        self.proc.wait()
        events.put(("exit", self))

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the rank's process group; False when the group no longer exists."""
        try:
            os.killpg(self.proc.pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def join_output(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._pumps:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._pumps)

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._close_files()

    def _close_files(self) -> None:
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass

    def exit_info(self) -> WorkerExit:
        return WorkerExit(self.spec.rank, self.spec.hostname, self.proc.returncode,
                          self.spec.command_text or self.spec.display, list(self.tail.lines),
                          self.tail.unseen_exception())


class RemoteProcess:
    """The part of ``subprocess.Popen`` that :func:`stop_workers` and the elastic driver read, for a worker that
    runs where this process has no child (a Ray actor, a Spark task): ``end(returncode)`` records its end."""

    def __init__(self, pid: int = -1) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._ended = threading.Event()

    def end(self, returncode: int) -> bool:
        """Record the worker's end; False when it had already ended."""
        if self._ended.is_set():
            return False
        self.returncode = returncode
        self._ended.set()
        return True

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"remote worker (pid {self.pid})", timeout)
        return self.returncode


def _install_signal_handlers(events: queue.SimpleQueue) -> Dict[int, object]:
    def handler(signum, frame):  # SimpleQueue.put is reentrant: safe in a signal handler
        events.put(("signal", signum))

    return install_stop_handlers(handler)


def install_stop_handlers(handler) -> Dict[int, object]:
    """Route SIGINT, SIGTERM and SIGHUP to ``handler`` (main thread only); returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, handler)
        except (ValueError, OSError):
            pass
    return previous


def restore_signal_handlers(previous: Dict[int, object]) -> None:
    """Put back the handlers that :func:`install_stop_handlers` replaced."""
    for signum, old in previous.items():
        try:
            signal.signal(signum, old)
        except (ValueError, OSError, TypeError):
            pass


def stop_workers(workers: Sequence[WorkerProcess], grace: float) -> None:
    """SIGTERM every live rank's process group, then SIGKILL what is left after ``grace`` seconds."""
    alive = [w for w in workers if w.proc.poll() is None]
    for w in alive:
        w.signal_group(signal.SIGTERM)
        w.signal_group(signal.SIGCONT)      # a stopped rank (SIGSTOP, Ctrl-Z) acts on the SIGTERM only once continued
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(w.proc.poll() is None for w in alive):
        time.sleep(0.02)
    for w in workers:
        if w.proc.poll() is None:
            log.debug("rank %d did not stop within %.0fs of SIGTERM; sending SIGKILL", w.spec.rank, grace)
        w.signal_group(signal.SIGKILL)
    for w in alive:
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("rank %d (pid %d) did not exit after SIGKILL", w.spec.rank, w.proc.pid)


def stopped_process(pid: int) -> Optional[Tuple[int, str]]:
    """The first process of ``pid``'s tree (``pid``, then what it started: a shell may run the program) that is
    stopped (SIGSTOP, Ctrl-Z, a debugger): its pid and psutil's status, or None. psutil.Error when ``pid`` itself
    cannot be read (NoSuchProcess: it is gone)."""
    import psutil

    leader = psutil.Process(pid)
    for proc in [leader] + leader.children(recursive=True):
        try:
            status = proc.status()
        except psutil.Error:
            continue
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return proc.pid, status
    return None


def stopped_note(workers: Sequence[WorkerProcess]) -> str:
    """A line naming the local ranks that are stopped right now (SIGSTOP, Ctrl-Z, a debugger), or ''. A rank that
    froze is what the others' stall reports point at; the launcher names it too."""
    import psutil

    found = []
    for w in workers:
        if w.proc.poll() is not None:
            continue
        try:
            stopped = stopped_process(w.proc.pid)
        except psutil.Error:
            continue
        if stopped is not None:
            found.append(f"rank {w.spec.rank} (pid {stopped[0]} on {w.spec.hostname})")
    if not found:
        return ""
    return (f"\nWhen the job ended, {', '.join(found)} {'was' if len(found) == 1 else 'were'} stopped (SIGSTOP, "
            "Ctrl-Z or a debugger): the others' stall reports point at it.")


def reap_leftovers(workers: Sequence[WorkerProcess]) -> None:
    """Wait for the output of every rank; kill processes a rank left behind that still hold its pipes."""
    deadline = time.monotonic() + 2.0
    stragglers = [w for w in workers if not w.join_output(max(0.0, deadline - time.monotonic()))]
    for w in stragglers:
        log.debug("rank %d left processes behind holding its output; stopping them", w.spec.rank)
        w.signal_group(signal.SIGTERM)
    if stragglers:
        time.sleep(0.2)
    for w in stragglers:
        w.signal_group(signal.SIGKILL)
        w.join_output(1.0)


def run_workers(specs: Sequence[WorkerSpec], output_dir: Optional[str] = None, prefix_timestamp: bool = False,
                grace: float = GRACE_SECONDS, stdout: Optional[IO[str]] = None,
                stderr: Optional[IO[str]] = None, local_pids: Optional[Dict[int, int]] = None) -> None:
    """Run all ranks to completion; return when every rank exited 0. ``local_pids`` (when given) gets the pid of
    every rank started on this machine, by rank, as it starts (the live page reads it).

    Raises JobFailedError (the first rank to exit non-zero), JobInterruptedError (SIGTERM/SIGHUP),
    KeyboardInterrupt (SIGINT) or WorkerStartError; in every case no rank process is left running.
    """
    sink = OutputSink(stdout, stderr, prefix_timestamp)
    events: queue.SimpleQueue = queue.SimpleQueue()
    workers: List[WorkerProcess] = []
    first_failure: Optional[WorkerProcess] = None
    stopped = ""                  # the note on ranks found stopped when a rank failed
    stop_signal: Optional[int] = None
    previous = _install_signal_handlers(events)
    size = len(specs)
    try:
        try:
            for spec in specs:
                out_dir = None
                if output_dir is not None:
                    out_dir = os.path.join(output_dir, f"rank.{pad_rank(spec.rank, size)}")
                workers.append(WorkerProcess(spec, sink, events, out_dir))
                if local_pids is not None and spec.local:
                    local_pids[spec.rank] = workers[-1].proc.pid
            remaining = len(workers)
            while remaining and first_failure is None and stop_signal is None:
                try:
                    kind, value = events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if kind == "signal":
                    stop_signal = value
                elif value.proc.returncode != 0:
                    first_failure = value
                else:
                    remaining -= 1
        except BaseException:
            stop_workers(workers, grace)
            raise
        if first_failure is not None:
            log.error("Process %d failed (%s) on %s. Terminating remaining workers after failure of Process %d.",
                      first_failure.spec.rank, describe_returncode(first_failure.proc.returncode),
                      first_failure.spec.hostname, first_failure.spec.rank)
            stopped = stopped_note(workers)
            flight_folder.await_records(workers, first_failure.proc.returncode)    # the others' flight records
            stop_workers(workers, grace)
        elif stop_signal is not None:
            log.error("Received %s: stopping all %d ranks.", signal.Signals(stop_signal).name, len(workers))
            stop_workers(workers, grace)
    finally:
        reap_leftovers(workers)
        for w in workers:
            w.close()
        restore_signal_handlers(previous)
    if stop_signal == signal.SIGINT:
        raise KeyboardInterrupt
    if stop_signal is not None:
        raise JobInterruptedError(stop_signal)
    if first_failure is not None:
        raise JobFailedError(first_failure.exit_info(), stopped)
