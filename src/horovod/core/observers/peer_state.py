"""What a rank can tell about another rank it waits for: its process state, its heartbeat, its stack.

A peer on this host is looked at directly: its process id comes from the kernel (the credentials of its Unix
socket, :func:`horovod.backends.peer_waits.peer_pid`) and its state from ``/proc`` (through psutil): stopped
(SIGSTOP or a debugger), exited, a zombie, or running. Any peer, here or on another host, also publishes a
heartbeat once a second through the job's rendezvous (:mod:`.heartbeat`): its age says whether the process (or
its host) still answers, and it carries what the peer is doing (the collective it runs, the rank it waits for).
Its Python stack is asked for through the same channel and comes back within :data:`STACK_SECONDS` when the
peer's heartbeat thread can run.
"""
from __future__ import annotations

import socket
from typing import Optional, Sequence, Tuple

import psutil

from horovod.core.observers import heartbeat

STACK_SECONDS = 2.0
# A peer on another host whose heartbeat is silent is probed with a TCP connection attempt to this port: any
# answer (refused included) says the host is up; silence within PROBE_SECONDS says it is unreachable.
PROBE_PORT, PROBE_SECONDS = 9, 1.0
MOST_RANKS = 4          # a report shows at most this many missing ranks' states and stacks
_STATES = {
    psutil.STATUS_STOPPED: "stopped (SIGSTOP, or a debugger holds it): it cannot run until it is continued",
    psutil.STATUS_TRACING_STOP: "stopped by a debugger (tracing stop): it cannot run until the debugger lets it go",
    psutil.STATUS_ZOMBIE: "exited (a zombie: its parent has not collected it yet)",
    psutil.STATUS_DEAD: "exited",
    psutil.STATUS_DISK_SLEEP: "blocked in the kernel (uninterruptible sleep: disk or driver I/O)",
}


def process_state(pid: int) -> str:
    """The local process ``pid``'s state, in words."""
    try:
        proc = psutil.Process(pid)
        status = proc.status()
    except psutil.NoSuchProcess:
        return "exited"
    except psutil.Error as exc:
        return f"unknown ({type(exc).__name__})"
    return _STATES.get(status, f"running ({status})")


def host_answers(address: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether ``address`` answers a TCP connection attempt at all (accepted or refused) within ``timeout``."""
    try:
        with socket.create_connection((address, PROBE_PORT), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _address(sock: Optional[socket.socket]) -> Optional[str]:
    try:
        return sock.getpeername()[0] if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) \
            else None
    except OSError:
        return None


def _state_of(peer: int, host: Optional[str], pid: Optional[int], sock: Optional[socket.socket]) -> Tuple[str, bool]:
    """(a sentence on rank ``peer``'s place, state and heartbeat; whether its stack could be asked for)."""
    beat = heartbeat.beat_of(peer)
    if beat is not None:
        host = host or beat.get("host")
        if pid is None and beat.get("host") == socket.gethostname():
            pid = int(beat.get("pid", 0)) or None
    where = f"host {host or '?'}" + (f", pid {pid}" if pid else "")
    state = process_state(pid) if pid else None
    said = heartbeat.describe_peer(peer, beat)
    if state is None and (not said or said.startswith("No heartbeat")):
        address = _address(sock) or (beat or {}).get("addr")
        if address is not None and not host_answers(address):
            state = (f"host unreachable: {host} ({address}) did not answer a connection attempt within "
                     f"{PROBE_SECONDS:g} s (its link is down, or it is gone)")
    text = " ".join([f"Rank {peer} ({where}):"] + ([state + "."] if state else []) + ([said] if said else []))
    if state is not None and state.startswith(("stopped", "exited", "host unreachable")):
        gone = state.split(":")[0].split(" (")[0]
        return text + f"\nNo Python stack can be taken from rank {peer}: it is {gone}.", False
    return text, True


def describe(peer: int, host: Optional[str] = None, pid: Optional[int] = None,
             sock: Optional[socket.socket] = None, with_stack: bool = True) -> str:
    """One paragraph on global rank ``peer``: where it is, its state, its heartbeat, and (``with_stack``) its
    Python stack when it can be had within :data:`STACK_SECONDS`. ``sock``, this rank's socket to it, gives its
    process id when it is local and lets a peer on another host be probed when its heartbeat says nothing; without
    them, its heartbeat's host and pid serve."""
    text, askable = _state_of(peer, host, pid, sock)
    return text + ("\n" + heartbeat.stacks_of([peer], STACK_SECONDS)[peer] if askable and with_stack else "")


def describe_ranks(peers: Sequence[int], most: int = MOST_RANKS) -> str:
    """:func:`describe` for several ranks (the first ``most``); the stacks of those that can answer are asked
    for at once."""
    shown = list(peers)[:most]
    states = {peer: _state_of(peer, None, None, None) for peer in shown}
    askable = [peer for peer in shown if states[peer][1]]
    stacks = heartbeat.stacks_of(askable, STACK_SECONDS) if askable else {}
    blocks = [states[peer][0] + (f"\n{stacks[peer]}" if peer in stacks else "") for peer in shown]
    if len(peers) > most:
        blocks.append(f"({len(peers) - most} more rank(s) not shown.)")
    return "\n".join(blocks)
