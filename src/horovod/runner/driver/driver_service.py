"""Upstream's import path ``horovod.runner.driver.driver_service``: which network interfaces the job uses.

Upstream's launcher started a driver service here and a task service on every host (over ssh), and let the tasks
probe each other to find the interfaces routed between all hosts. Our launcher runs no such services: workers
reach the launcher's authenticated rendezvous store at the address this machine routes to the remote hosts from
(or at ``--network-interfaces``), see :func:`horovod.runner.common.util.network.get_driver_ip`.
:func:`get_common_interfaces` answers from that same routing; the service classes exist by name only.
"""
from __future__ import annotations

from typing import Any, Iterable, NoReturn, Optional, Set

from horovod.runner.common.util import network as common_network
from horovod.runner.util import lsf, network

_NO_SERVICES = ("{name}: upstream's driver/task service protocol is not part of this Horovod. The launcher reaches "
                "remote hosts over ssh and its workers meet at the authenticated rendezvous store "
                "(horovod.runner.rendezvous.RendezvousServer); for interfaces use get_common_interfaces().")


def _no_services(name: str) -> NoReturn:
    raise NotImplementedError(_NO_SERVICES.format(name=name))


class HorovodRunDriverService:
    """Upstream's driver service (the launcher's side of the interface probe). Not available: raises
    NotImplementedError saying what to use instead."""

    NAME = "horovod driver service"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_services("HorovodRunDriverService")


class HorovodRunDriverClient:
    """Upstream's client of :class:`HorovodRunDriverService`. Not available: raises NotImplementedError."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_services("HorovodRunDriverClient")


def get_local_interfaces(settings: Any) -> Set[str]:
    """The interfaces with address 127.0.0.1 (among ``settings.nics`` when set); ValueError when there is none."""
    nics = set()
    for nic in settings.nics or [None]:
        nics |= network.get_local_intfs(nic)
    if not nics:
        raise ValueError("No interface is found for address 127.0.0.1.")
    return nics


def _routing_interfaces(remote_host_names: Iterable[str]) -> Set[str]:
    """The interfaces whose IPv4 address this machine uses to reach each of the remote hosts."""
    import psutil

    by_address = {addr.address: nic for nic, addrs in psutil.net_if_addrs().items() for addr in addrs}
    nics = set()
    for host in remote_host_names:
        local = common_network.route_address(host)
        if local is None or local not in by_address:
            raise ValueError(f"Cannot find the interface this machine reaches {host} through; "
                             "pass --network-interfaces.")
        nics.add(by_address[local])
    return nics


def get_common_interfaces(settings: Any, all_host_names: Iterable[str],
                          remote_host_names: Optional[Iterable[str]] = None, fn_cache: Any = None) -> Optional[Set[str]]:
    """The interfaces the job's hosts talk through: None inside LSF (as upstream); ``settings.nics`` when given
    and some hosts are remote; else the interfaces routing to the remote hosts; with no remote host the loopback
    ones (:func:`get_local_interfaces`). ``fn_cache`` is upstream's probe cache and unused."""
    if lsf.using_lsf():
        return None
    all_host_names = list(all_host_names)
    remote = (network.filter_local_addresses(all_host_names) if remote_host_names is None
              else list(remote_host_names))
    if not remote:
        return get_local_interfaces(settings)
    if settings.nics:
        return set(settings.nics)
    return _routing_interfaces(remote)
