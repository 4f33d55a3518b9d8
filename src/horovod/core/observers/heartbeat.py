"""Every rank's heartbeat through the job's rendezvous, and its Python stack on request.

Under horovodrun (static and elastic) every rank reaches the launcher's authenticated key-value store
(``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT`` and the job secret). A daemon thread in each rank puts, once a second,
a small record under scope :data:`BEAT_SCOPE`, key ``<global rank>``: wall time, host, pid and what its engines
do (the collective running and for how long, and the rank it waits for in the data plane). Between beats it
long-polls the key ``<global rank>`` of :data:`ASK_SCOPE`: when another rank asks for its stack, it answers
with every thread's Python stack, the program's own threads first, under :data:`STACK_SCOPE`.

So a rank that stalls can say of a peer on any host whether it still beats (alive: then what it does and where
its code is) or not (how long since its last beat: stopped, frozen in native code that holds the GIL, or its host
cut off). Jobs started without horovodrun's rendezvous (plain ``mpirun``) have no such channel, and the reports
say so. The heartbeat costs one small put per second per rank.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional

from horovod.common import config, wire
from horovod.common.kvstore import KVStoreClient

log = logging.getLogger("horovod.stall")

BEAT_SCOPE, ASK_SCOPE, STACK_SCOPE = "horovod-heartbeat", "horovod-stack-ask", "horovod-stack"
BEAT_SECONDS = 1.0
STALE_SECONDS = 3 * BEAT_SECONDS        # a heartbeat older than this says the rank (or its host) does not answer
READ_TIMEOUT_SECONDS = 2.0              # a report reads the store at most this long per call (its host may be cut)
HOROVOD_THREAD_PREFIX = "horovod-"
OWN_THREAD_FRAMES = 2       # innermost frames shown of Horovod's own threads (the program's threads: all of them)

Status = Callable[[], dict]


def _client(timeout: float = 5.0) -> Optional[KVStoreClient]:
    """A new connection to the job's rendezvous store, or None when this job has none."""
    addr, port = config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    key = wire.secret_from_env()
    if not addr or not port or key is None:
        return None
    try:
        return KVStoreClient(addr, int(port), key, timeout=timeout)
    except (OSError, wire.AuthenticationError) as exc:
        log.debug("heartbeat: no rendezvous store to use: %s", exc)
        return None


class Heartbeat:
    """This rank's heartbeat thread, and its answers to stack requests."""

    def __init__(self, rank: int, status: Status) -> None:
        self.rank = rank
        self.status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovod-heartbeat", daemon=True)
        self._client: Optional[KVStoreClient] = None

    def start(self) -> bool:
        """Start beating; False when the job has no rendezvous store to beat to."""
        self._client = _client()
        if self._client is None:
            return False
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2 * BEAT_SECONDS + 1.0)
        if self._client is not None:
            self._client.close()

    def _run(self) -> None:
        client, me = self._client, str(self.rank)
        assert client is not None
        try:
            # The address this rank reaches the launcher from: a peer can probe it when the beats stop.
            addr = client.local_address()
            while not self._stop.is_set():
                record = {"t": time.time(), "host": socket.gethostname(), "pid": os.getpid(), "addr": addr,
                          **self.status()}
                client.put(BEAT_SCOPE, me, wire.pack(record))
                try:
                    asked = client.wait(ASK_SCOPE, [me], BEAT_SECONDS)[0]
                except TimeoutError:
                    continue
                client.delete(ASK_SCOPE, me)
                client.put(STACK_SCOPE, f"{me}/{asked.decode()}", own_stack().encode())
        except (OSError, wire.PeerClosedError, ValueError) as exc:
            if not self._stop.is_set():
                log.debug("heartbeat: the rendezvous store went away: %s", exc)


def own_stack() -> str:
    """Every thread's Python stack, the program's own threads first (Horovod's own last), innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    ours = [i for i in frames if not names.get(i, "").startswith(HOROVOD_THREAD_PREFIX)]
    theirs = [i for i in frames if i not in ours]
    blocks = []
    for ident in ours + theirs:
        if ident == threading.get_ident():
            continue
        name = names.get(ident, f"thread {ident}")
        stack = traceback.format_stack(frames[ident])
        if ident in theirs:             # Horovod's own threads: where they are is enough
            stack = stack[-OWN_THREAD_FRAMES:]
        blocks.append(f"Thread {name!r}:\n" + "".join(stack).rstrip())
    return "\n".join(blocks)


class _Reader:
    """The reporting side: one connection, opened on first use, shared under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Optional[KVStoreClient] = None
        self._tried = False

    def client(self) -> Optional[KVStoreClient]:
        if not self._tried:
            self._tried = True
            self._client = _client(READ_TIMEOUT_SECONDS)
        return self._client

    def beat_of(self, peer: int) -> Optional[dict]:
        with self._lock:
            client = self.client()
            if client is None:
                return None
            raw = client.get(BEAT_SCOPE, str(peer))
        return wire.unpack(raw) if raw else None

    def stacks_of(self, peers: List[int], timeout: float) -> Optional[Dict[int, str]]:
        """Ask every rank in ``peers`` for its stack at once; what came back within ``timeout`` ('' for none)."""
        with self._lock:
            client = self.client()
            if client is None:
                return None
            ask = f"{os.getpid()}-{time.monotonic_ns()}"
            keys = {peer: f"{peer}/{ask}" for peer in peers}
            for peer in peers:
                client.put(ASK_SCOPE, str(peer), ask.encode())
            try:
                values = client.wait(STACK_SCOPE, list(keys.values()), timeout)
                return {peer: value.decode() for peer, value in zip(peers, values)}
            except TimeoutError:
                got = {}
                for peer, key in keys.items():
                    value = client.get(STACK_SCOPE, key)
                    got[peer] = value.decode() if value else ""
                    if not value:
                        client.delete(ASK_SCOPE, str(peer))
                return got

    def beat_or_none(self, peer: int) -> Optional[dict]:
        try:
            return self.beat_of(peer)
        except (OSError, wire.PeerClosedError, ValueError):
            return None


_reader = _Reader()
_running: Dict[int, Heartbeat] = {}


def start(rank: int, status: Status) -> None:
    """Start this process's heartbeat as global rank ``rank`` (again after each init)."""
    global _reader
    stop()
    _reader = _Reader()
    beat = Heartbeat(rank, status)
    if beat.start():
        _running[rank] = beat


def stop() -> None:
    for beat in list(_running.values()):
        beat.stop()
    _running.clear()


def describe_peer(peer: int, beat: Optional[dict] = None) -> str:
    """A sentence on global rank ``peer``'s heartbeat (``beat`` when already read): its age, and what it was
    doing; '' without a channel."""
    if beat is None:
        try:
            beat = _reader.beat_of(peer)
        except (OSError, wire.PeerClosedError, ValueError) as exc:
            return f"Its heartbeat cannot be read ({exc})."
    if beat is None:
        return ("It has no heartbeat in the job's rendezvous (it never started one, or the job has no rendezvous)."
                if _reader.client() is not None else "")
    age = max(0.0, time.time() - float(beat.get("t", 0.0)))
    doing = _doing(beat)
    if age > STALE_SECONDS:
        return (f"No heartbeat for {age:.1f} s: the process is stopped or frozen (native code holding the GIL), "
                f"or its host cannot reach the launcher's host. Its last heartbeat said: {doing}.")
    return f"Its heartbeat is {age:.1f} s old: {doing}."


def _doing(beat: dict) -> str:
    running = beat.get("running")
    if not running:
        return "no collective running (it is in its own code)"
    text = f"{running} for {beat.get('running_s', 0.0):.1f} s"
    waiting = beat.get("waiting_for")
    if waiting is not None:
        text += f", waiting {beat.get('waiting_s', 0.0):.1f} s for rank {waiting}"
    return text


def stacks_of(peers: List[int], timeout: float) -> Dict[int, str]:
    """Each rank's Python stack (every thread, its own code first), or a line that says why it could not be had
    within ``timeout`` seconds; the ranks are asked at once."""
    try:
        stacks = _reader.stacks_of(list(peers), timeout)
    except (OSError, wire.PeerClosedError, ValueError) as exc:
        return {p: f"No Python stack from rank {p}: the rendezvous store cannot be reached ({exc})." for p in peers}
    if stacks is None:
        return {p: f"No Python stack from rank {p}: this job has no rendezvous to ask through (it was not started "
                   "by horovodrun)." for p in peers}
    return {p: (f"Rank {p}'s Python stack (every thread, the program's own first):\n{stack}" if stack else
                f"No Python stack from rank {p} within {timeout:g} s: its heartbeat thread did not answer (stopped, "
                "native code holding the GIL, or its host is gone).") for p, stack in stacks.items()}


def beat_of(peer: int) -> Optional[dict]:
    """Rank ``peer``'s last heartbeat record (host, pid, what it does), or None."""
    return _reader.beat_or_none(peer)


def what(batch: list) -> str:
    """A batch of tensor responses in words: "ALLREDUCE of tensor 'x' and 3 more tensor(s)"."""
    from horovod.common.types import RequestType

    first = batch[0]
    try:
        op = RequestType(first.rtype).name
    except ValueError:
        op = str(first.rtype)
    more = f" and {len(batch) - 1} more tensor(s)" if len(batch) > 1 else ""
    return f"{op} of tensor '{first.name}'{more}"


def status_lines(engines: List) -> dict:
    """What a rank's engines are doing, for its heartbeat: the first running collective and the data-plane wait
    of its engine thread, if any."""
    from horovod.backends import peer_waits

    now, waits = time.monotonic(), dict(peer_waits.snapshot())
    for engine in engines:
        running = engine.running
        if running is None:
            continue
        batch, started = running
        status = {"running": what(batch), "running_s": now - started}
        wait = waits.get(engine.thread_ident)
        if wait is not None:
            status.update(waiting_for=wait.peer, waiting_s=wait.quiet_for(now))
        return status
    return {}
