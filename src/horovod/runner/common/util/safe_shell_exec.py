"""Upstream's import path ``horovod.runner.common.util.safe_shell_exec``: run a shell command, forward its output
line by line (optionally prefixed), and stop it with all its children when asked.

Built on the launcher's own process handling (:mod:`horovod.runner.process`): the command runs in a session of
its own (so one signal to its process group reaches everything it started), it gets SIGTERM when this process
dies (Linux ``PR_SET_PDEATHSIG``; upstream ran a spawned "middleman" Python process for that), and its output is
split at ``\\n``, ``\\r\\n`` and lone ``\\r`` as the ranks' output is. The prefix is upstream's
``[<index>]<stdout>:`` (with the time in front when ``prefix_output_with_timestamp``).

Differences from upstream, on purpose: the command's stdin is ``/dev/null`` (upstream's inherited the caller's,
so an ``ssh`` could swallow the terminal's input), and a KeyboardInterrupt while waiting stops the command and is
raised again instead of being swallowed.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Iterable, Mapping, Optional

from horovod.runner.process import OutputSink, _die_with_parent_fn, split_lines

log = logging.getLogger(__name__)

GRACEFUL_TERMINATION_TIME_S = 5


def terminate_executor_shell_and_children(pid: int) -> None:
    """Stop the shell ``pid`` and every process under it, as upstream: SIGTERM to its children, up to
    :data:`GRACEFUL_TERMINATION_TIME_S` for them to exit, SIGSTOP to the shell (so it starts nothing new),
    SIGKILL to what is left of the children's trees, then SIGTERM (SIGKILL after the grace) to the shell."""
    import psutil

    try:
        shell = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for child in shell.children():
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(shell.children(), timeout=GRACEFUL_TERMINATION_TIME_S)
    try:
        shell.send_signal(signal.SIGSTOP)
    except psutil.NoSuchProcess:
        pass
    for child in alive:
        try:
            for grandchild in child.children(recursive=True):
                try:
                    grandchild.kill()
                except psutil.NoSuchProcess:
                    pass
            child.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        shell.terminate()
        shell.send_signal(signal.SIGCONT)       # a stopped shell acts on the SIGTERM only once continued
        shell.wait(timeout=GRACEFUL_TERMINATION_TIME_S)
    except psutil.TimeoutExpired:
        try:
            shell.kill()
        except psutil.NoSuchProcess:
            pass
    except psutil.NoSuchProcess:
        pass


def prefix_connection(src_connection: IO[bytes], dst_stream: IO[str], prefix: Optional[str],
                      index: Optional[int], prefix_output_with_timestamp: bool,
                      lock: Optional[threading.Lock] = None) -> None:
    """Copy ``src_connection`` (anything with ``fileno()`` and ``close()``) to the text stream ``dst_stream`` line
    by line until end-of-file, then close it.

    Each line is written as soon as it ends (at ``\\n``, ``\\r\\n`` or a lone ``\\r``, so progress bars show live)
    and flushed; with ``index`` and ``prefix`` both given it is prefixed ``{time}[{index}]<{prefix}>:``, the time
    only with ``prefix_output_with_timestamp``. Bytes are decoded as UTF-8 (invalid bytes replaced). ``lock``
    serializes the writes of several forwarders into one stream.
    """
    sink = OutputSink(prefix_timestamp=prefix_output_with_timestamp)
    lock = lock or threading.Lock()
    try:
        for raw in split_lines(src_connection):
            text = raw.decode("utf-8", "replace")
            if index is not None and prefix is not None:
                text = sink.format(index, prefix, text)
            with lock:
                try:
                    dst_stream.write(text)
                    dst_stream.flush()
                except (OSError, ValueError):
                    pass            # the destination went away: keep draining so that the command never blocks
    except (OSError, ValueError):
        pass
    finally:
        src_connection.close()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group, SIGKILL after :data:`GRACEFUL_TERMINATION_TIME_S`."""
    for signum in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            return
    try:
        proc.wait(timeout=GRACEFUL_TERMINATION_TIME_S)
    except subprocess.TimeoutExpired:
        log.debug("command (pid %d) did not stop within %ss of SIGTERM; sending SIGKILL", proc.pid,
                  GRACEFUL_TERMINATION_TIME_S)
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # also whatever it left behind in its group
    except (ProcessLookupError, PermissionError):
        pass


def execute(command: str, env: Optional[Mapping[str, str]] = None, stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None, index: Optional[int] = None,
            events: Optional[Iterable[threading.Event]] = None, prefix_output_with_timestamp: bool = False) -> int:
    """Run ``command`` in a shell and return its exit code (``128 + N`` when signal N ended it).

    Its stdout and stderr go to the text streams ``stdout`` and ``stderr`` (default ``sys.stdout`` and
    ``sys.stderr``), prefixed as :func:`prefix_connection` says when ``index`` is given. When any of ``events``
    (threading or multiprocessing events) is set, the command's process group gets SIGTERM, then SIGKILL after
    :data:`GRACEFUL_TERMINATION_TIME_S`. ``env`` replaces the environment (default: this process's).
    Processes that the command leaves running in the background and that still hold its output are stopped the
    same way :data:`GRACEFUL_TERMINATION_TIME_S` after it exits (upstream waited for them without limit).
    """
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    proc = subprocess.Popen(command, shell=True, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_die_with_parent_fn())
    lock = threading.Lock() if stdout is stderr else None
    forwarders = [threading.Thread(target=prefix_connection, name=f"safe-shell-exec-{name}", daemon=True,
                                   args=(pipe, stream, name, index, prefix_output_with_timestamp, lock))
                  for pipe, stream, name in ((proc.stdout, stdout, "stdout"), (proc.stderr, stderr, "stderr"))]
    stopping = threading.Event()
    done = threading.Event()

    def watch(event: threading.Event) -> None:
        while not done.is_set():
            if event.wait(0.1):
                stopping.set()
                _stop_group(proc)
                return

    for thread in forwarders:
        thread.start()
    for event in events or ():
        threading.Thread(target=watch, args=(event,), name="safe-shell-exec-event", daemon=True).start()
    try:
        exit_code = proc.wait()
    except BaseException:
        _stop_group(proc)               # interrupted: nothing of the command may outlive the call
        raise
    finally:
        done.set()
    deadline = time.monotonic() + GRACEFUL_TERMINATION_TIME_S
    for thread in forwarders:           # the output of a command that left children behind ends when they do
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in forwarders):
        log.debug("command %r exited but processes it started still hold its output; stopping them", command)
        _stop_group(proc)
        for thread in forwarders:
            thread.join(1.0)
    if stopping.is_set():
        log.debug("command %r was stopped by an event (exit code %d)", command, exit_code)
    return 128 - exit_code if exit_code < 0 else exit_code
