"""Whether a rank's waits poll before they block: only where every rank on its machine may have a core.

Polling (``HOROVOD_SPIN_MICROSECONDS``: the engine thread after activity, a socket receive, a fast round's wait)
saves a scheduler wake-up on both sides when the awaited bytes arrive while the waiter polls, which needs the
peer to be running on a core of its own. Where a machine's ranks outnumber its cores, the poll takes the core
the peer needs, and nothing arrives until the waiter gives up: pure loss (docs/benchmarks.md, issue 31: a 4 KB
allreduce over 4 hosts x 2 ranks on 2 cores took 2450 us polling and 1543 us not; a 1 MB allreduce of 4 ranks on
2 cores 1344-1767 us against 981-1012).

The machine is the kernel, not the host name: network namespaces, containers and VMs-in-name-only that run on
one kernel share its cores, and all report its boot id. Ranks publish theirs when they connect
(:mod:`horovod.backends.mesh`), so each knows how many ranks share its cores.
"""
from __future__ import annotations

import os
import socket

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def machine_id() -> str:
    """What every process on this kernel shares and no other machine has: the boot id (Linux), else the host
    name."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def poll_microseconds(configured: float, ranks_on_machine: int) -> float:
    """How long waits poll: ``configured`` (HOROVOD_SPIN_MICROSECONDS) where every one of the machine's
    ``ranks_on_machine`` ranks may have a core, else 0."""
    return configured if ranks_on_machine <= cores() else 0.0
