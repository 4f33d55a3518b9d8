"""Upstream's import path ``horovod.runner.util.network``: local addresses, host resolution, free ports.

The launcher itself uses :mod:`horovod.runner.common.util.network`; these are the names upstream's test
utilities and users' scripts import.
"""
from __future__ import annotations

import random
import socket
from typing import Any, Callable, Iterable, List, Optional, Set, Tuple

from horovod.runner.common.util.network import filter_local_addresses as _remote_hosts
from horovod.runner.common.util.network import nic_ipv4


def _get_local_host_addresses() -> Set[str]:
    """The IPv4 addresses of this machine's interfaces (what :func:`get_local_host_addresses` returns; the name
    upstream's tests import and patch)."""
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def get_local_host_addresses() -> Set[str]:
    """The IPv4 addresses of this machine's interfaces."""
    return _get_local_host_addresses()


def get_local_intfs(nic: Optional[str] = None) -> Set[str]:
    """The loopback interfaces (those with 127.0.0.1), restricted to ``nic`` when given."""
    import psutil

    return {iface for iface, addrs in psutil.net_if_addrs().items()
            if (not nic or iface == nic) and any(a.family == socket.AF_INET and a.address == "127.0.0.1"
                                                 for a in addrs)}


def resolve_host_address(host_name: str) -> Optional[str]:
    """The IPv4 address of ``host_name``, or None when it does not resolve."""
    try:
        return socket.gethostbyname(host_name)
    except socket.gaierror:
        return None


def filter_local_addresses(all_host_names: Iterable[str]) -> List[str]:
    """The host names that are not this machine, in order."""
    return _remote_hosts(all_host_names)


def find_port(server_factory: Callable[[Tuple[str, int]], Any]) -> Tuple[Any, int]:
    """``(server_factory(('', port)), port)`` for the first port from a random start that the factory can bind."""
    low, high = 1024, 65536
    start = random.randrange(0, high - low)
    for offset in range(high - low):
        port = low + (start + offset) % (high - low)
        try:
            return server_factory(("", port)), port
        except OSError:
            continue
    raise RuntimeError("Unable to find a port to bind to.")


def get_driver_ip(nics: Iterable[str]) -> str:
    """The IPv4 address of the first of ``nics`` (the interfaces every worker can reach the driver on)."""
    iface = next(iter(nics))
    addr = nic_ipv4(iface)
    if not addr:
        raise RuntimeError(f"Cannot find an IPv4 address of the common interface {iface}.")
    return addr
