"""Which rank failed, from mpirun's own report: Open MPI 4/5 and PRRTE's "first process" and signal
messages, Hydra's BAD TERMINATION block, and MPICH's ``-print-all-exitcodes`` report."""
from __future__ import annotations

import dataclasses
import re
import signal
from typing import List, Optional, Sequence, Tuple

from .process import describe_returncode

# mpirun's reports of the first failed rank (Open MPI 4/5 and PRRTE; MPICH/Intel MPI's Hydra).
_OMPI_EXIT = re.compile(r"The first process to do so was:\s+Process name:\s*(\S+)\s+Exit code:\s*(-?\d+)")
_OMPI_SIGNAL = re.compile(r"noticed that process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)")
_HYDRA_FAIL = re.compile(
    r"(?:RANK (\d+)\s+)?PID \d+ RUNNING AT (\S+)\s*=*\s*(?:EXIT CODE:\s*(-?\d+)|KILLED BY SIGNAL:\s*(\d+))"
)


@dataclasses.dataclass
class ParsedFailure:
    """The first failed rank as mpirun reported it; ``returncode`` is negative for a signal (Popen's way)."""

    rank: Optional[int]
    hostname: Optional[str]
    returncode: int


def parse_failure(text: str) -> Optional[ParsedFailure]:
    """The earliest failure report in mpirun's output ``text``, or None when it contains none."""
    found: List[Tuple[int, ParsedFailure]] = []
    for m in _OMPI_EXIT.finditer(text):
        numbers = re.findall(r"\d+", m.group(1))
        rank = int(numbers[-1]) if numbers else None
        found.append((m.start(), ParsedFailure(rank, None, int(m.group(2)))))
    for m in _OMPI_SIGNAL.finditer(text):
        found.append((m.start(), ParsedFailure(int(m.group(1)), m.group(2), -int(m.group(3)))))
    for m in _HYDRA_FAIL.finditer(text):
        rank = int(m.group(1)) if m.group(1) is not None else None
        code = int(m.group(3)) if m.group(3) is not None else -int(m.group(4))
        found.append((m.start(), ParsedFailure(rank, m.group(2), code)))
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1]


# MPICH's ``-print-all-exitcodes``: ``[mpiexec@host] Exit codes: [node1] 0,768`` then ``[node2] 9,0`` on the
# next lines, one entry per host in host order, each listing the raw wait statuses of its ranks in rank order.
_HYDRA_EXIT_CODES = re.compile(r"Exit codes:((?:\s*\[[^\]\s]+\]\s+-?\d+(?:,-?\d+)*)+)")
_HYDRA_HOST_CODES = re.compile(r"\[([^\]\s]+)\]\s+(-?\d+(?:,-?\d+)*)")
# Signals that Hydra's cleanup (or a user) sends: a rank ended by one is more likely a victim than the cause.
_STOP_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def _wait_status(status: int) -> int:
    """A raw wait status as Popen reports it: the exit code, or minus the signal."""
    if status < 0:
        return 255
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF


def parse_hydra_exit_codes(text: str) -> Optional[List[Tuple[str, int]]]:
    """(host, returncode) of every rank, in the order mpiexec listed them (rank order for ``-ppn`` placement),
    from MPICH's ``-print-all-exitcodes`` report in ``text``; None when there is none."""
    match = _HYDRA_EXIT_CODES.search(text)
    if match is None:
        return None
    return [(host, _wait_status(int(code)))
            for host, codes in _HYDRA_HOST_CODES.findall(match.group(1)) for code in codes.split(",")]


def hydra_first_failure(codes: Sequence[Tuple[str, int]]) -> Optional[ParsedFailure]:
    """The rank that most likely failed first, from every rank's exit status (MPICH reports no order).

    The most telling status wins: a crash (a signal other than SIGKILL/SIGTERM/SIGINT), then an exit code other
    than 1, then a stop signal (the OOM killer's SIGKILL; Hydra's cleanup also SIGKILLs the others once a rank
    dies without MPI_Finalize), then exit code 1 (Python's for an uncaught exception, which is also how the
    other Horovod ranks end once one failed). Within that class: the only rank, or the only rank whose status
    differs from the others' (``1, 5, 1``: rank 1); None when it is a tie (every rank exited 1, say).
    """
    def kind(rc: int) -> int:
        if rc < 0:
            return 2 if -rc in _STOP_SIGNALS else 0
        return 3 if rc == 1 else 1

    failed = [(rank, host, rc) for rank, (host, rc) in enumerate(codes) if rc != 0]
    if not failed:
        return None
    best = min(kind(rc) for _, _, rc in failed)
    group = [f for f in failed if kind(f[2]) == best]
    if len(group) > 1:
        group = [f for f in group if sum(1 for g in group if g[2] == f[2]) == 1]
        if len(group) != 1:
            return None
    rank, host, rc = group[0]
    return ParsedFailure(rank, host, rc)


def describe_exit_codes(codes: Sequence[Tuple[str, int]], limit: int = 16) -> str:
    """``rank 0 (node1): exit code 1; rank 2 (node2): killed by SIGKILL`` for the ranks that failed."""
    failed = [f"rank {rank} ({host}): {describe_returncode(rc)}" for rank, (host, rc) in enumerate(codes) if rc]
    more = f"; and {len(failed) - limit} more" if len(failed) > limit else ""
    return "; ".join(failed[:limit]) + more
