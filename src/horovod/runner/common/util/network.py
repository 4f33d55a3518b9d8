"""Which hosts are this machine, and which address remote workers reach the launcher at.

A host given as ``localhost``, ``127.0.0.1``, this machine's host name or one of its addresses is launched
locally (no ssh) and keeps the name it was given as ``HOROVOD_HOSTNAME``, so ``-H localhost:2,127.0.0.1:2``
simulates two hosts on one machine.
"""
from __future__ import annotations

import functools
import socket
from typing import Iterable, List, Optional, Sequence, Set

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost"}


@functools.lru_cache(maxsize=1)
def local_addresses() -> Set[str]:
    """All IP addresses of this machine's interfaces (IPv4 and IPv6, without zone suffixes)."""
    import psutil

    addrs = set()
    for snics in psutil.net_if_addrs().values():
        for snic in snics:
            if snic.family in (socket.AF_INET, socket.AF_INET6):
                addrs.add(snic.address.split("%", 1)[0])
    return addrs


@functools.cache
def is_local_host(hostname: str) -> bool:
    """True when ``hostname`` names this machine (so its ranks are started without ssh)."""
    name = hostname.strip().lower()
    if name in LOOPBACK_NAMES or name.startswith("127."):
        return True
    own_name = socket.gethostname().lower()
    if name in (own_name, own_name.split(".")[0], socket.getfqdn().lower()):
        return True
    if name in local_addresses():
        return True
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except (socket.gaierror, UnicodeError, OSError):
        return False
    return any(addr.startswith("127.") or addr == "::1" or addr in local_addresses() for addr in resolved)


def filter_local_addresses(hostnames: Iterable[str]) -> List[str]:
    """The host names that are *not* this machine, in order (upstream's helper of the same name)."""
    return [h for h in hostnames if not is_local_host(h)]


def nic_ipv4(nic: str) -> Optional[str]:
    """The first IPv4 address of interface ``nic``, or None when it has none (or does not exist)."""
    import psutil

    for snic in psutil.net_if_addrs().get(nic, []):
        if snic.family == socket.AF_INET:
            return snic.address
    return None


def route_address(remote_host: str) -> Optional[str]:
    """The local IPv4 address the kernel would use to reach ``remote_host`` (no packet is sent)."""
    try:
        remote_ip = socket.gethostbyname(remote_host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((remote_ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def get_driver_ip(nics: Optional[Sequence[str]], remote_hosts: Sequence[str] = ()) -> str:
    """The address workers use to reach the launcher's rendezvous server.

    With ``--network-interfaces`` it is the IPv4 address of the first listed interface that has one. Otherwise
    it is the address this machine uses to route to the first remote host, or the host name's address.
    Raises ValueError when none of the given interfaces has an IPv4 address.
    """
    if nics:
        for nic in nics:
            addr = nic_ipv4(nic)
            if addr:
                return addr
        raise ValueError(
            f"None of the network interfaces {', '.join(nics)} has an IPv4 address on this machine; "
            "check --network-interfaces (see `ip addr`)."
        )
    for host in remote_hosts:
        addr = route_address(host)
        if addr:
            return addr
    return socket.gethostbyname(socket.gethostname())
