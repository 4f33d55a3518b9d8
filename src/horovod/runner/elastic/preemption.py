"""The driver's side of spot preemption: which slots' workers left the job, and the plans that leave them out.

A worker that receives SIGTERM (a spot instance about to be reclaimed, a pod being evicted) tells the driver that
it leaves (:func:`horovod.common.elastic_rendezvous.announce_leaving`) and exits at its next commit; the driver
records it as LEFT (:mod:`.registration`), neither a failure nor a success. Its slot stays out of the job while
the discovery keeps listing its host: the host is going away, and a worker started there would only fail. Once
the discovery stops listing the host (the instance is gone), the slot is forgotten, so that the host, or a new
instance under the same name, joins again like any new host. With fixed hosts (``-H``), which never disappear,
a slot that left stays out for the rest of the job.

Workers are identified by their slot ``host:index`` for their whole life, while their local rank follows the
round: with slot ``a:1`` gone, slots ``a:0`` and ``a:2`` are local ranks 0 and 1. :meth:`LeftSlots.plan` keys
each round's places by slot, and :meth:`LeftSlots.slot_index` gives the index a new worker is started with.
"""
from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Set

from horovod.common.elastic_rendezvous import slot_key
from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments

from .discovery import DiscoveredHosts

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup


def split_slot(slot: str):
    """``("host", index)`` of a slot key ``host:index`` (host names may contain colons: IPv6)."""
    host, _, index = slot.rpartition(":")
    return host, int(index)


class LeftSlots:
    """The slots whose workers were preempted, by host, until the discovery stops listing the host."""

    def __init__(self) -> None:
        self._by_host: Dict[str, Set[int]] = {}

    def add(self, slot: str) -> None:
        host, index = split_slot(slot)
        self._by_host.setdefault(host, set()).add(index)

    def __contains__(self, slot: str) -> bool:
        host, index = split_slot(slot)
        return index in self._by_host.get(host, ())

    def hosts(self) -> List[str]:
        return sorted(self._by_host)

    def forget_missing(self, listed: Iterable[str]) -> List[str]:
        """Forget the slots of hosts the discovery no longer lists (their instance is gone; when the host is listed
        again it is a new one); returns those hosts."""
        listed = set(listed)
        gone = sorted(host for host in self._by_host if host not in listed)
        for host in gone:
            del self._by_host[host]
            log.info("host %s is no longer listed by the discovery: its preempted slots may be used again when it "
                     "comes back", host)
        return gone

    def usable(self, current: DiscoveredHosts, host: str) -> List[int]:
        """The slot indices of ``host`` that may take part in the next round."""
        left = self._by_host.get(host, set())
        return [i for i in range(current.get_slots(host)) if i not in left]

    def count_usable(self, current: DiscoveredHosts) -> int:
        """The usable slots of the hosts that may be used (blacklisted hosts are not in the assignment order)."""
        return sum(len(self.usable(current, host)) for host in current.host_assignment_order)

    def plan(self, current: DiscoveredHosts, min_np: int, max_np: Optional[int]) -> Dict[str, SlotInfo]:
        """The next round's places keyed by slot, in rank order (hosts in the discovery's assignment order, each
        host's usable slots in index order); ValueError when fewer than ``min_np`` slots are usable."""
        usable = {host: self.usable(current, host) for host in current.host_assignment_order}
        hosts = [HostInfo(host, len(indices)) for host, indices in usable.items() if indices]
        return {slot_key(info.hostname, usable[info.hostname][info.local_rank]): info
                for info in get_host_assignments(hosts, min_np, max_np)}

    @staticmethod
    def slot_index(slot: str) -> int:
        """The index a worker started for ``slot`` is given (its ``HOROVOD_LOCAL_RANK`` until the driver assigns
        its place): the worker's slot key is made from it."""
        return split_slot(slot)[1]
