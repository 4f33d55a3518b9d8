"""Bootstrapping the job's sockets: every rank publishes its listening addresses (through the rendezvous
store, or an MPI allgather under mpirun), then connects to every lower rank and accepts every higher one.

Ranks on the same host talk over abstract Unix sockets (no files, and about 15 µs round trips), ranks on
different hosts over TCP. Every connection is authenticated with the job's secret before either side reads a
byte of payload. Besides one data socket per pair, every worker opens a control socket to rank 0, the
coordinator, for negotiation.

Two bounds, as upstream's Gloo context has: the exchange of addresses is bounded by the start timeout
(``HOROVOD_START_TIMEOUT``: every rank must reach the rendezvous), the connections once the addresses are known by
``HOROVOD_GLOO_TIMEOUT_SECONDS`` (``--gloo-timeout-seconds``): a peer that does not connect in time fails the
set-up with :class:`HorovodInternalError` naming it.
"""
from __future__ import annotations

import dataclasses
import logging
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple, Union

import psutil

from horovod.backends import spin
from horovod.backends.comm import enlarge_buffers
from horovod.common import config, wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.kvstore import KVStoreClient
from horovod.common.topology import Topology

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Mesh:
    """The connected sockets of one process, indexed by global rank."""

    rank: int
    size: int
    hosts: List[str]
    data: List[Optional[socket.socket]]
    control: Dict[int, socket.socket]       # rank 0: worker rank -> socket; a worker: {0: socket}
    listeners: List[socket.socket]
    on_machine: int = 1         # ranks on this rank's machine (its kernel: namespaces share it), this one included

    def close(self) -> None:
        for sock in list(self.data) + list(self.control.values()) + self.listeners:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


def _iface_address(iface: str) -> str:
    for addr in psutil.net_if_addrs().get(iface, []):
        if addr.family == socket.AF_INET:
            return addr.address
    raise ValueError(f"HOROVOD_GLOO_IFACE={iface!r} has no IPv4 address on this host; "
                     f"interfaces here: {', '.join(sorted(psutil.net_if_addrs()))}.")


def _connect(info: dict, same_host: bool, key: bytes, hello: bytes, deadline: float) -> socket.socket:
    last: Optional[Exception] = None
    while True:
        try:
            if same_host:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                enlarge_buffers(sock)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect(info["uds"])
            else:
                sock = socket.create_connection((info["addr"], info["port"]),
                                                timeout=max(0.1, deadline - time.monotonic()))
                enlarge_buffers(sock)
            wire.tune_socket(sock)
            wire.connect_handshake(sock, key, hello, timeout=max(0.1, deadline - time.monotonic()))
            return sock
        except wire.AuthenticationError:
            raise
        except OSError as exc:
            last = exc
            if time.monotonic() > deadline:
                raise ConnectionError(f"could not connect to {info['host']} at {info['addr']}:{info['port']} "
                                      f"({last})") from exc
            time.sleep(0.05)


Publish = Callable[[dict, float], List[dict]]
# Which connection round this is: init's number, or "<init's number>.ps<id>" for a process set's own mesh.
Generation = Union[int, str]


def kv_publish(kv: KVStoreClient, generation: int, timeout: float,
               abandoned: Optional[Callable[[], bool]] = None) -> Publish:
    """Exchange listening addresses through the launcher's rendezvous store.

    ``abandoned`` (elastic jobs) is asked every second while peers are missing; when it says the driver gave
    the round up, the wait ends at once with :class:`HorovodInternalError` instead of running into the timeout.
    """

    def publish(me: dict, remaining: float) -> List[dict]:
        scope = f"mesh.{generation}"
        size = me["size"]
        keys = [str(r) for r in range(size)]
        kv.put(scope, str(me["rank"]), wire.pack(me))
        deadline = time.monotonic() + remaining
        while True:
            left = deadline - time.monotonic()
            try:
                return [wire.unpack(v) for v in kv.wait(scope, keys, left if abandoned is None else min(1.0, left))]
            except TimeoutError:
                if abandoned is not None and abandoned():
                    raise HorovodInternalError(f"round {generation} of the elastic job was abandoned by the driver "
                                               "(a worker failed while it formed)") from None
                if time.monotonic() < deadline:
                    continue
            present = kv.items(scope)
            missing = [r for r in range(size) if str(r) not in present]
            raise TimeoutError(
                f"Rank(s) {', '.join(map(str, missing))} did not reach the rendezvous within {timeout:.0f}s. "
                "Check that they started (see their output), or raise --start-timeout / HOROVOD_START_TIMEOUT."
            )

    return publish


def default_bind_address() -> str:
    """This host's address for peers on other hosts: HOROVOD_GLOO_IFACE's, else the first non-loopback IPv4."""
    import horovod.common.config as config

    iface = config.get("HOROVOD_GLOO_IFACE")
    if iface:
        return _iface_address(iface)
    for _name, addrs in sorted(psutil.net_if_addrs().items()):
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return "127.0.0.1"


def _listen(bind_addr: str, uds_name: str, size: int) -> List[socket.socket]:
    """This rank's two listening sockets: TCP on ``bind_addr`` (any port) and the abstract Unix ``uds_name``."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((bind_addr, 0))
    tcp.listen(2 * size + 8)
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    enlarge_buffers(uds)
    uds.bind(uds_name)
    uds.listen(2 * size + 8)
    return [tcp, uds]


def _greet(conn: socket.socket, key: bytes, generation: Generation, size: int) -> Tuple[str, int]:
    """Authenticate an accepted connection: its purpose (``data``/``ctrl``) and its peer's rank. Raises
    AuthenticationError, OSError, ValueError or TypeError for a connection that is not a peer of this job."""
    enlarge_buffers(conn)
    wire.tune_socket(conn)
    hello = wire.unpack(wire.accept_handshake(conn, key, timeout=5.0))
    purpose, peer, gen = hello
    if gen != generation or not (0 <= peer < size):
        raise wire.AuthenticationError(f"unexpected hello {hello!r}")
    return purpose, peer


def _accept_peers(listeners: List[socket.socket], expected: int, key: bytes, generation: Generation, rank: int,
                  size: int, deadline: float, data: List[Optional[socket.socket]],
                  control: Dict[int, socket.socket], errors: List[BaseException]) -> None:
    """Accept ``expected`` authenticated connections into ``data`` / ``control`` (by the peer's rank) before
    ``deadline``; what stopped it goes into ``errors``. Connections that fail the handshake are dropped."""
    selector = selectors.DefaultSelector()
    for listener in listeners:
        selector.register(listener, selectors.EVENT_READ)
    got = 0
    try:
        while got < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out waiting for peers to connect")
            for ready, _ in selector.select(min(remaining, 0.5)):
                conn, _addr = ready.fileobj.accept()
                try:
                    purpose, peer = _greet(conn, key, generation, size)
                except (OSError, wire.AuthenticationError, ValueError, TypeError) as exc:
                    log.warning("rank %d: rejected a connection: %s", rank, exc)
                    conn.close()
                    continue
                conn.settimeout(None)
                if purpose == "ctrl":
                    control[peer] = conn
                else:
                    data[peer] = conn
                got += 1
    except BaseException as exc:
        errors.append(exc)
    finally:
        selector.close()


def connect_timeout_from_config(start_timeout: float) -> float:
    """``HOROVOD_GLOO_TIMEOUT_SECONDS``, the bound on connecting the peers; a value of 0 or less means the start
    timeout."""
    import horovod.common.config as config

    value = float(config.get("HOROVOD_GLOO_TIMEOUT_SECONDS"))
    return value if value > 0 else start_timeout


def build_mesh(topo: Topology, key: bytes, publish: Publish, generation: Generation, timeout: float,
               bind_addr: str, connect_timeout: Optional[float] = None) -> Mesh:
    """Connect this rank to every other rank of the job (called by every rank at init), or of a process set
    (``topo`` then gives the rank's position in the set and the set's size).

    ``publish`` shares this rank's listening addresses and returns every rank's, in rank order: through the
    rendezvous store under horovodrun (:func:`kv_publish`), through an MPI allgather under mpirun, or through
    the global set's engine for a process set; it gets ``timeout`` seconds. Then the peers connect within
    ``connect_timeout`` seconds (default: :func:`connect_timeout_from_config`), else HorovodInternalError names
    the missing ranks. On failure every socket opened here is closed again.
    """
    if connect_timeout is None:
        connect_timeout = connect_timeout_from_config(timeout)
    deadline = time.monotonic() + timeout
    rank, size = topo.rank, topo.size
    uds_name = f"\0horovod-{wire.secret_fingerprint(key)}-{generation}-{topo.hostname}-{rank}"
    listeners = _listen(bind_addr, uds_name, size)
    data: List[Optional[socket.socket]] = [None] * size
    control: Dict[int, socket.socket] = {}
    try:
        me = {"host": topo.hostname, "addr": bind_addr, "port": listeners[0].getsockname()[1], "uds": uds_name,
              "rank": rank, "size": size, "machine": spin.machine_id(), "alike": config.alike_values()}
        infos = publish(me, max(0.1, deadline - time.monotonic()))
        hosts = [i["host"] for i in infos]
        # Settings that choose how ranks exchange data: ranks that differ would wait for each other for ever, so
        # every rank (each has every rank's values) fails here, naming them.
        differ = config.disagreement([i.get("alike") for i in infos], hosts)
        if differ is not None:
            raise ValueError(differ)
        on_machine = sum(1 for i in infos if i.get("machine") == infos[rank].get("machine"))
        _connect_peers(topo, key, generation, connect_timeout, listeners, infos, data, control)
    except BaseException:
        Mesh(rank, size, [], data, control, listeners).close()
        raise
    for sock in list(data) + list(control.values()):
        if sock is not None:
            sock.setblocking(True)
    # Everyone is connected: stop listening, so that later connection attempts are refused outright.
    for listener in listeners:
        listener.close()
    return Mesh(rank, size, hosts, data, control, [], on_machine)


def _connect_peers(topo: Topology, key: bytes, generation: Generation, timeout: float,
                   listeners: List[socket.socket], infos: List[dict], data: List[Optional[socket.socket]],
                   control: Dict[int, socket.socket]) -> None:
    """Connect to every lower rank (and, on a worker, the control socket to rank 0) while accepting every higher
    one, filling ``data`` and ``control``, all within ``timeout`` seconds; HorovodInternalError names the peers
    that did not connect."""
    deadline = time.monotonic() + timeout
    rank, size = topo.rank, topo.size
    hosts = [i["host"] for i in infos]
    expected = (size - 1 - rank) + (size - 1 if rank == 0 else 0)
    errors: List[BaseException] = []
    acceptor = threading.Thread(target=_accept_peers, name="horovod-accept", daemon=True,
                                args=(listeners, expected, key, generation, rank, size, deadline, data, control,
                                      errors))
    acceptor.start()
    unreachable: Dict[int, BaseException] = {}
    try:
        for peer in range(rank):
            try:
                data[peer] = _connect(infos[peer], hosts[peer] == topo.hostname, key,
                                      wire.pack(["data", rank, generation]), deadline)
            except ConnectionError as exc:
                unreachable[peer] = exc
        if rank != 0 and 0 not in unreachable:
            try:
                control[0] = _connect(infos[0], hosts[0] == topo.hostname, key,
                                      wire.pack(["ctrl", rank, generation]), deadline)
            except ConnectionError as exc:
                unreachable[0] = exc
    finally:
        acceptor.join(max(0.1, deadline - time.monotonic()) + 1.0)
    if unreachable or errors or acceptor.is_alive():
        silent = [p for p in range(rank + 1, size) if data[p] is None]
        if rank == 0:
            silent += [p for p in range(1, size) if p not in control and p not in silent]
        raise HorovodInternalError(_not_connected(rank, sorted(set(silent) | set(unreachable)), timeout,
                                                  unreachable, errors))


def _not_connected(rank: int, missing: List[int], timeout: float, unreachable: Dict[int, BaseException],
                   errors: List[BaseException]) -> str:
    """The message of a data plane that could not be set up: which ranks, the bound and its knob, what to check."""
    causes = [f"rank {peer}: {exc}" for peer, exc in sorted(unreachable.items())]
    causes += [str(exc) for exc in errors if not isinstance(exc, TimeoutError)]
    return (f"Rank {rank} and rank(s) {', '.join(map(str, missing))} did not connect within {timeout:g} s "
            "(--gloo-timeout-seconds / HOROVOD_GLOO_TIMEOUT_SECONDS), although every rank reached the rendezvous"
            + (f" ({'; '.join(causes)})" if causes else "") + ". Check that the hosts can reach each other on the "
            "data plane's addresses (a firewall, or the interface: --network-interfaces / HOROVOD_GLOO_IFACE), that "
            "those ranks are not stuck, or raise --gloo-timeout-seconds.")
