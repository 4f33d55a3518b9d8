"""The stall inspector: on the coordinator, notice tensors that some ranks submitted and others did not.

Such a tensor usually means the ranks run different code paths (one skipped a collective, or submitted tensors
under different names), and the job would wait forever. After ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (default 60)
the coordinator logs a warning naming the tensors, the ranks that have not submitted them and how long the
others have waited; it repeats while the stall lasts. With ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` set, a stall
that long shuts the job down with an error stating the same facts, on every rank. Every pending tensor takes
part, including those the response cache knows (the cache only shortens the coordinator's answer).

The :class:`DeadlockDetector` (ours) recognizes the stall that can never resolve: every rank that has not joined
is blocked in a wait on a handle, and no pending tensor can become ready (none has been submitted by every rank,
and nothing is being emitted). For a program that submits collectives from one thread that is a certain deadlock,
so once the condition has held for ``HOROVOD_DEADLOCK_CHECK_TIME_SECONDS`` with no new submission, it is reported
on every rank, naming what each rank waits on, and ``HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS`` later the job ends:
every pending handle fails with the report. The engine tells the coordinator which ranks wait (see
engine/waits.py). :class:`StallObserver` runs both on the engine's hooks.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from horovod.common import config
from horovod.common.exceptions import HorovodInternalError
from horovod.core.controller import Coordinator
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.settings import (
    confirm_seconds,
    lapse_seconds,  # noqa: F401  (the deadlock timing, named here too)
)
from horovod.core.observers import heartbeat, peer_state

log = logging.getLogger("horovod.stall")  # a named channel: see horovod.common.logging_setup

HEADLINE = ("One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
            "waiting for remainder of ranks for more than {seconds:g} seconds. This may indicate that different "
            "ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, "
            "which will cause deadlock.")
MAX_NAMES_PER_RANK = 5
DEADLOCK_HEADLINE = ("Deadlock: every rank is blocked waiting for a collective that can never complete. No tensor "
                     "that a rank waits on has been submitted by every rank, and no rank submitted anything for "
                     "{seconds:.1f} s.")
DEADLOCK_ADVICE = ("The ranks took different code paths: one skipped a collective, called collectives in another "
                   "order, or failed between two of them (for example an assertion or exception on one rank only). "
                   "Make every rank submit the same collectives in the same order.")
REPORT, SHUTDOWN = "report", "shutdown"


def _where(where: str) -> str:
    """The process set a report is about, as a sentence after its headline (nothing for the global set)."""
    return f" (This is{where}.)" if where else ""


class StallInspector:
    """Decides, from the coordinator's pending tensors, when to warn and when to shut the job down."""

    def __init__(self, size: int, warning_s: float, shutdown_s: float = 0.0,
                 ranks: Optional[Sequence[int]] = None, where: str = "") -> None:
        self.size = size
        self.ranks = list(ranks) if ranks is not None else list(range(size))   # position -> global rank
        self.where = where          # e.g. " in process set 1 (ranks [1, 3])"
        self.warning_s = warning_s
        if 0 < shutdown_s < warning_s:
            log.warning("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=%g is less than HOROVOD_STALL_CHECK_TIME_SECONDS=%g; "
                        "it is ignored (a stall is only recognized after the check time).", shutdown_s, warning_s)
            shutdown_s = 0.0
        self.shutdown_s = shutdown_s
        self.interval = max(0.05, min(1.0, warning_s / 4))
        # Add each missing rank's state and Python stack (peer_state: up to 2 s, once per report).
        self.where_missing = True
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
            heartbeat.publish_report("stall shutdown", message)     # for the launcher's live page
            return message
        fresh = [s for s in stalled if now - self._warned.get(s[0], -1e18) >= self.warning_s]
        if fresh:
            for name, _, _ in fresh:
                self._warned[name] = now
            message = self._describe(fresh, absent, shutdown=False)
            log.warning("%s", message)
            heartbeat.publish_report("stall", message)
        return None

    def _describe(self, stalled: Sequence[Tuple[str, float, List[int]]], absent: set, shutdown: bool) -> str:
        missing: Dict[int, List[Tuple[str, float]]] = {}
        for name, waited, ranks in stalled:
            for rank in range(self.size):
                if rank not in ranks and rank not in absent:
                    missing.setdefault(rank, []).append((name, waited))
        lines = [HEADLINE.format(seconds=self.warning_s) + _where(self.where), "Missing ranks:"]
        for rank in sorted(missing):
            names = sorted(missing[rank], key=lambda item: -item[1])
            shown = ", ".join(f"{name} (waiting {waited:.1f} s)" for name, waited in names[:MAX_NAMES_PER_RANK])
            more = f" and {len(names) - MAX_NAMES_PER_RANK} more" if len(names) > MAX_NAMES_PER_RANK else ""
            mark = "!" if shutdown and any(w > self.shutdown_s for _, w in names) else ""
            lines.append(f"{self.ranks[rank]}{mark}: [{shown}{more}]")
        if self.where_missing and missing:
            lines.append("Where the missing ranks are:")
            lines.append(peer_state.describe_ranks([self.ranks[rank] for rank in sorted(missing)]))
        if shutdown:
            lines.append(f"Shutting down: tensors stalled for more than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
                         f"{self.shutdown_s:g} s. Make every rank submit the same tensors (same names, same "
                         "order of collectives), or raise the limit.")
        return "\n".join(lines)


class DeadlockDetector:
    """Decides, from who waits on which pending tensor, when a deadlock is certain, and when to end the job.

    :meth:`check` is called periodically by the coordinator while some tensor is pending. The condition must hold
    at every check for ``confirm_s`` while ``progress`` (the coordinator's count of requests taken and responses
    emitted) stays the same: a program that submits from several threads may pass through the same state briefly.
    """

    def __init__(self, size: int, confirm_s: float, shutdown_s: float, shutdown: bool = True,
                 ranks: Optional[Sequence[int]] = None, where: str = "") -> None:
        self.size = size
        self.ranks = list(ranks) if ranks is not None else list(range(size))   # position -> global rank
        self.where = where
        self.confirm_s = max(0.0, confirm_s)
        self.shutdown_s = max(0.0, shutdown_s)
        self.shutdown = shutdown
        self.interval = max(0.05, min(0.5, self.confirm_s / 4))
        self.next_check = 0.0
        self._progress = -1
        self._since: Optional[float] = None         # the condition has held since, with no progress
        self._reported_at: Optional[float] = None
        self._report = ""

    def due_in(self, now: float) -> float:
        """Seconds until the next check."""
        return max(0.0, self.next_check - now)

    def check(self, waits: Sequence[Tuple[str, str, List[int], List[int]]], joined: Iterable[int], ready: bool,
              progress: int, now: float, several_threads: Iterable[int] = ()) -> Optional[Tuple[str, str]]:
        """(REPORT or SHUTDOWN, message) when the deadlock is to be reported or the job ended, else None.

        ``waits`` holds (name, op type, ranks that submitted, ranks blocked waiting on it) for pending tensors;
        ``ready`` says whether some tensor is ready to be emitted. ``several_threads``: ranks whose program submits
        collectives from several threads (a TF1 graph); another of their threads may still submit what the others
        wait for, so the state is reported but the job is not ended.
        """
        self.next_check = now + self.interval
        needed = set(range(self.size)).difference(joined)
        blocked = not ready and bool(needed) and needed <= {r for w in waits for r in w[3]}
        if not blocked or progress != self._progress or self._since is None:
            self._progress = progress
            if self._reported_at is not None:
                log.warning("The deadlock reported before has resolved: the ranks made progress again.")
                heartbeat.publish_report("deadlock resolved", "The deadlock reported before has resolved: the "
                                         "ranks made progress again.")
            self._since = now if blocked else None
            self._reported_at = None
            return None
        if self._reported_at is None:
            if now - self._since < self.confirm_s:
                return None
            self._reported_at = now
            self._report = self._describe(waits, needed, now - self._since)
            threaded = [self.ranks[r] for r in sorted(needed.intersection(several_threads))]
            if self.shutdown and threaded:
                label = "Rank" if len(threaded) == 1 else "Ranks"
                tail = (f"{label} {', '.join(map(str, threaded))} submit collectives from several threads (as a "
                        "TensorFlow 1 graph does), where another thread may still submit what the others wait for: "
                        "the job is not ended. If it stays blocked, look for a collective that only some ranks "
                        "run (a branch or a fetch that differs between ranks).")
            elif self.shutdown:
                tail = (f"The job ends in {self.shutdown_s:g} s (HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS) unless "
                        "the ranks make progress. A program that submits collectives from several threads can set "
                        "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE=1 to only report.")
            else:
                tail = "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE is set: the job is not ended and stays blocked."
            message = f"{self._report}\n{tail}"
            log.error("%s", message)
            heartbeat.publish_report("deadlock", message)
            return REPORT, message
        if self.shutdown and now - self._reported_at >= self.shutdown_s and not needed.intersection(several_threads):
            self._reported_at = float("inf")        # once
            message = (f"{self._report}\nEnded the job: the deadlock lasted HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS="
                       f"{self.shutdown_s:g} s past its report, so every pending collective fails.")
            heartbeat.publish_report("deadlock shutdown", message)
            return SHUTDOWN, message            # the engine's abort logs it on every rank
        return None

    def _describe(self, waits: Sequence[Tuple[str, str, List[int], List[int]]], needed: Set[int],
                  held: float) -> str:
        lines = [DEADLOCK_HEADLINE.format(seconds=held) + _where(self.where)]
        for rank in sorted(needed):
            mine = [w for w in waits if rank in w[3]]
            shown = []
            for name, op, submitted, _ in mine[:MAX_NAMES_PER_RANK]:
                missing = [self.ranks[r] for r in sorted(needed.difference(submitted))]
                if missing:
                    label = "rank" if len(missing) == 1 else "ranks"
                    shown.append(f"{name} ({op}; not submitted by {label} {', '.join(map(str, missing))})")
                else:
                    shown.append(f"{name} ({op}; submitted by every rank, held for the rest of its group)")
            more = f" and {len(mine) - MAX_NAMES_PER_RANK} more" if len(mine) > MAX_NAMES_PER_RANK else ""
            lines.append(f"Rank {self.ranks[rank]} waits on {', '.join(shown)}{more}.")
        joined = [self.ranks[r] for r in sorted(set(range(self.size)).difference(needed))]
        if joined:
            label, pronoun = ("Rank", "it counts") if len(joined) == 1 else ("Ranks", "they count")
            lines.append(f"{label} {', '.join(map(str, joined))} joined (hvd.join): {pronoun} as having submitted "
                         "every tensor.")
        lines.append(DEADLOCK_ADVICE)
        return "\n".join(lines)


def deadlock_from_config(size: int, ranks: Optional[Sequence[int]] = None,
                         where: str = "") -> Optional[DeadlockDetector]:
    """The deadlock detector for the coordinator, or None when it is off (HOROVOD_STALL_CHECK_DISABLE or
    HOROVOD_DEADLOCK_CHECK_DISABLE, or a one-rank job)."""
    if size < 2 or config.get("HOROVOD_STALL_CHECK_DISABLE") or config.get("HOROVOD_DEADLOCK_CHECK_DISABLE"):
        return None
    return DeadlockDetector(size, confirm_seconds(), config.get("HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS"),
                            shutdown=not config.get("HOROVOD_DEADLOCK_SHUTDOWN_DISABLE"), ranks=ranks, where=where)


def from_config(size: int, ranks: Optional[Sequence[int]] = None, where: str = "") -> Optional[StallInspector]:
    """The inspector for the coordinator, or None with HOROVOD_STALL_CHECK_DISABLE."""
    if config.get("HOROVOD_STALL_CHECK_DISABLE"):
        return None
    return StallInspector(size, config.get("HOROVOD_STALL_CHECK_TIME_SECONDS"),
                          config.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), ranks=ranks, where=where)


class StallObserver(EngineObserver):
    """Runs the stall inspector and the deadlock detector on rank 0 while some tensors are partial."""

    def __init__(self, inspector: Optional[StallInspector], detector: Optional[DeadlockDetector]) -> None:
        self.inspector = inspector
        self.detector = detector

    def inspect(self, coordinator: Coordinator, now: float, report: Callable[[str], None]) -> Optional[float]:
        """Check when due; a shutdown by either raises, which ends the job on every rank."""
        due: Optional[float] = None
        inspector, detector = self.inspector, self.detector
        if inspector is not None:
            if now >= inspector.next_check:
                message = inspector.check(coordinator.pending_names(), coordinator.joined, now)
                if message is not None:
                    raise HorovodInternalError(message)
            due = inspector.due_in(now)
        if detector is not None:
            if now >= detector.next_check:
                verdict = detector.check(coordinator.waits(), coordinator.joined, coordinator.has_ready(),
                                         coordinator.progress, now, several_threads=coordinator.several_threads)
                if verdict is not None:
                    kind, message = verdict
                    if kind == SHUTDOWN:
                        raise HorovodInternalError(message)
                    report(message)
            wanted = detector.due_in(now)
            due = wanted if due is None else min(due, wanted)
        return due


def observer_from_config(size: int, ranks: Optional[Sequence[int]] = None,
                         where: str = "") -> Optional[StallObserver]:
    """The stall and deadlock observer of a process set's coordinator (the global set's: rank 0) as the
    environment configures it, or None when both are off. ``ranks`` gives the set's global ranks and ``where``
    names the set in the messages (empty for the global set)."""
    inspector = from_config(size, ranks, where) if size > 1 else None
    detector = deadlock_from_config(size, ranks, where)
    if inspector is None and detector is None:
        return None
    return StallObserver(inspector, detector)

