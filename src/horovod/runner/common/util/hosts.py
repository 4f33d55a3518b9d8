"""Hosts and slots: parsing ``-H``/``--hostfile`` and assigning ranks to slots, as upstream does.

``get_host_assignments`` keeps upstream's algorithm: ranks fill the hosts in the order given, ``local_rank``
restarts at 0 on each host, and ``cross_rank`` is the index of a host among the hosts that have a slot with the
same ``local_rank`` (``cross_size`` is how many such hosts there are).
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Dict, List, Optional, Tuple

HOST_PATTERN = re.compile(r"^[\w.-]+:[0-9]+$")


@dataclasses.dataclass
class HostInfo:
    """A host name and its number of slots (processes it may run)."""

    hostname: str
    slots: int

    @staticmethod
    def from_string(host_string: str) -> HostInfo:
        """Parse ``name:slots``; ValueError with an example when malformed."""
        text = host_string.strip()
        if not HOST_PATTERN.match(text):
            raise ValueError(
                f"Invalid host entry {host_string!r}: expected <hostname>:<slots>, "
                "for example -H server1:4,server2:4."
            )
        hostname, slots = text.rsplit(":", 1)
        return HostInfo(hostname, int(slots))


@dataclasses.dataclass
class SlotInfo:
    """Where one rank runs and its place in the job (upstream's ``SlotInfo``)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: Optional[int] = None
    local_size: Optional[int] = None
    cross_size: Optional[int] = None

    def to_response_string(self) -> str:
        """``rank,size,local_rank,local_size,cross_rank,cross_size`` (upstream's elastic wire format)."""
        values = [self.rank, self.size, self.local_rank, self.local_size, self.cross_rank, self.cross_size]
        return ",".join(str(v) for v in values)


INVALID_SLOT_INFO = SlotInfo(hostname="", rank=-1, local_rank=-1, cross_rank=-1, size=-1, local_size=-1,
                             cross_size=-1)


def parse_host_files(filename: str) -> str:
    """Read a hostfile (``<hostname> slots=<n>`` per line) and return the ``-H`` string ``host:n,...``.

    Blank lines and ``#`` comments are skipped; a line with only a host name means one slot (as in Open MPI).
    """
    hosts = []
    with open(filename) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            slots = "1"
            for extra in parts[1:]:
                key, _, value = extra.partition("=")
                if key.strip() in ("slots", "max_slots", "max-slots") and value.strip().isdigit():
                    if key.strip() == "slots":
                        slots = value.strip()
                else:
                    raise ValueError(
                        f"{filename}:{lineno}: cannot parse {raw.strip()!r}; each line must be "
                        "'<hostname> slots=<slots>'."
                    )
            hosts.append(f"{parts[0]}:{slots}")
    if not hosts:
        raise ValueError(f"Host file {filename} lists no hosts; each line must be '<hostname> slots=<slots>'.")
    return ",".join(hosts)


def parse_hosts(hosts_string: str) -> List[HostInfo]:
    """Parse ``host1:2,host2:4`` into HostInfo objects; a host listed twice is an error."""
    infos = [HostInfo.from_string(h) for h in hosts_string.split(",") if h.strip()]
    if not infos:
        raise ValueError("No hosts given: expected <hostname>:<slots>[,<hostname>:<slots>...].")
    seen = set()
    for info in infos:
        if info.hostname in seen:
            raise ValueError(
                f"Host {info.hostname!r} is listed more than once in {hosts_string!r}; give each host once "
                "with its total number of slots."
            )
        seen.add(info.hostname)
    return infos


def parse_hosts_and_slots(hosts: str) -> Tuple[List[str], Dict[str, int]]:
    """Host names in order and a ``name -> slots`` map (upstream's helper)."""
    infos = parse_hosts(hosts)
    return [h.hostname for h in infos], {h.hostname: h.slots for h in infos}


def get_host_assignments(hosts: List[HostInfo], min_np: int, max_np: Optional[int] = None) -> List[SlotInfo]:
    """Assign ranks to the hosts' slots, in host order, and compute local and cross ranks.

    Every slot is used up to ``max_np`` (so without ``max_np`` all slots get a rank, upstream's behaviour:
    ``-H localhost:4`` with ``min_np=2`` yields 4 slots). Raises ValueError when fewer than ``min_np`` slots
    exist.
    """
    host_ranks = []
    cross_ranks: Dict[int, Dict[str, int]] = collections.defaultdict(dict)
    rank = 0
    for host_info in hosts:
        ranks = []
        for local_rank in range(host_info.slots):
            if rank == max_np:
                break
            ranks.append(rank)
            rank += 1
            cross_ranks_at_local = cross_ranks[local_rank]
            cross_ranks_at_local[host_info.hostname] = len(cross_ranks_at_local)
        host_ranks.append((host_info, ranks))

    world_size = rank
    if world_size < min_np:
        raise ValueError(
            f"Requested more processes ({min_np}) than there are available slots ({world_size}). "
            "Add slots with -H host:<slots> (or 'slots=' in the hostfile), or lower -np."
        )

    alloc_list = []
    for host_info, ranks in host_ranks:
        local_size = len(ranks)
        for local_rank, r in enumerate(ranks):
            cross_ranks_at_local = cross_ranks[local_rank]
            alloc_list.append(SlotInfo(
                hostname=host_info.hostname,
                rank=r,
                local_rank=local_rank,
                cross_rank=cross_ranks_at_local[host_info.hostname],
                size=world_size,
                local_size=local_size,
                cross_size=len(cross_ranks_at_local),
            ))
    return alloc_list
