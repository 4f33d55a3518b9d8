"""The stall inspector: on the coordinator, notice tensors that some ranks submitted and others did not.

Such a tensor usually means the ranks run different code paths (one skipped a collective, or submitted tensors
under different names), and the job would wait forever. After ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (default 60)
the coordinator logs a warning naming the tensors, the ranks that have not submitted them and how long the
others have waited; it repeats while the stall lasts. With ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` set, a stall
that long shuts the job down with an error stating the same facts, on every rank. Every pending tensor takes
part, including those the response cache knows (the cache only shortens the coordinator's answer).
"""
from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from horovod.common import config

log = logging.getLogger("horovod.stall")

HEADLINE = ("One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
            "waiting for remainder of ranks for more than {seconds:g} seconds. This may indicate that different "
            "ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, "
            "which will cause deadlock.")
MAX_NAMES_PER_RANK = 5


class StallInspector:
    """Decides, from the coordinator's pending tensors, when to warn and when to shut the job down."""

    def __init__(self, size: int, warning_s: float, shutdown_s: float = 0.0) -> None:
        self.size = size
        self.warning_s = warning_s
        if 0 < shutdown_s < warning_s:
            log.warning("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=%g is less than HOROVOD_STALL_CHECK_TIME_SECONDS=%g; "
                        "it is ignored (a stall is only recognized after the check time).", shutdown_s, warning_s)
            shutdown_s = 0.0
        self.shutdown_s = shutdown_s
        self.interval = max(0.05, min(1.0, warning_s / 4))
        self.next_check = 0.0
        self._warned: Dict[str, float] = {}     # tensor name -> when we last warned about it

    def due_in(self, now: float) -> float:
        """Seconds until the next check."""
        return max(0.0, self.next_check - now)

    def check(self, pending: Iterable[Tuple[str, float, List[int]]], joined: Iterable[int],
              now: float) -> Optional[str]:
        """Warn about stalled tensors; return the shutdown message when the job must stop, else None.

        ``pending`` holds (name, first submitted at, ranks that submitted) for tensors not yet ready.
        """
        self.next_check = now + self.interval
        absent = set(joined)
        stalled = [(name, now - since, ranks) for name, since, ranks in pending if now - since > self.warning_s]
        live = {name for name, _, _ in stalled}
        self._warned = {n: t for n, t in self._warned.items() if n in live}
        if not stalled:
            return None
        if self.shutdown_s > 0 and any(waited > self.shutdown_s for _, waited, _ in stalled):
            message = self._describe(stalled, absent, shutdown=True)
            log.error("%s", message)
            return message
        fresh = [s for s in stalled if now - self._warned.get(s[0], -1e18) >= self.warning_s]
        if fresh:
            for name, _, _ in fresh:
                self._warned[name] = now
            log.warning("%s", self._describe(fresh, absent, shutdown=False))
        return None

    def _describe(self, stalled: Sequence[Tuple[str, float, List[int]]], absent: set, shutdown: bool) -> str:
        missing: Dict[int, List[Tuple[str, float]]] = {}
        for name, waited, ranks in stalled:
            for rank in range(self.size):
                if rank not in ranks and rank not in absent:
                    missing.setdefault(rank, []).append((name, waited))
        lines = [HEADLINE.format(seconds=self.warning_s), "Missing ranks:"]
        for rank in sorted(missing):
            names = sorted(missing[rank], key=lambda item: -item[1])
            shown = ", ".join(f"{name} (waiting {waited:.1f} s)" for name, waited in names[:MAX_NAMES_PER_RANK])
            more = f" and {len(names) - MAX_NAMES_PER_RANK} more" if len(names) > MAX_NAMES_PER_RANK else ""
            mark = "!" if shutdown and any(w > self.shutdown_s for _, w in names) else ""
            lines.append(f"{rank}{mark}: [{shown}{more}]")
        if shutdown:
            lines.append(f"Shutting down: tensors stalled for more than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
                         f"{self.shutdown_s:g} s. Make every rank submit the same tensors (same names, same "
                         "order of collectives), or raise the limit.")
        return "\n".join(lines)


def from_config(size: int) -> Optional[StallInspector]:
    """The inspector for the coordinator, or None with HOROVOD_STALL_CHECK_DISABLE."""
    if config.get("HOROVOD_STALL_CHECK_DISABLE"):
        return None
    return StallInspector(size, config.get("HOROVOD_STALL_CHECK_TIME_SECONDS"),
                          config.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))
