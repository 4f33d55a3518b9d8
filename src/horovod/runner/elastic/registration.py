"""What became of each worker of the current round, and what the driver does once all of them are known
(upstream's ``WorkerStateRegistry``, without its barrier: the driver's single event loop records states, so no
thread waits on another and a worker that never reports cannot hang the job, see :mod:`.driver`).

A worker of the round is READY when it asked for the next round (it left this one alive), SUCCESS when it exited
with status 0, LEFT when it announced that it was preempted (SIGTERM, see :mod:`.preemption`) and then exited, and
FAILURE when it exited otherwise or was stopped for not reporting. The decision, once every worker of the round
has a state, follows upstream: any success ends the job; all failures end it; otherwise the failed workers' hosts
are blacklisted, and the job ends when no host is left or the reset limit is reached, else it re-forms. A worker
that LEFT is neither: its host is not blacklisted, and the job goes on without it; when every worker of the round
left, nobody holds the training state and the job ends (:data:`Decision.ALL_LEFT`).
"""
from __future__ import annotations

import enum
import logging
from typing import Dict, List, Optional, Set

from . import constants
from .discovery import HostManager

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

READY = "READY"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
LEFT = "LEFT"


class Decision(enum.Enum):
    """What the driver does with a round whose workers all have a state."""

    FINISH = "finish"        # a worker succeeded: the job is over (it failed if any worker failed)
    FAIL = "fail"            # every worker failed, or every host is blacklisted
    RESET_LIMIT = "limit"    # the reset limit is reached
    RESET = "reset"          # form the next round
    ALL_LEFT = "all left"    # every worker of the round was preempted: nobody holds the state


class WorkerStateRegistry:
    """The states of the current round's workers, keyed by slot (``host:local_rank``)."""

    def __init__(self, host_manager: HostManager, reset_limit: Optional[int] = None) -> None:
        self._host_manager = host_manager
        self._reset_limit = reset_limit
        self.reset_count = 0
        self._members: Set[str] = set()
        self._states: Dict[str, str] = {}
        self._hosts: Dict[str, str] = {}

    def reset(self, members: Dict[str, str]) -> None:
        """A new round with these workers (slot -> host); forgets the previous round's states."""
        self._members = set(members)
        self._hosts = dict(members)
        self._states = {}

    def record(self, slot: str, state: str) -> None:
        """Record a worker's state; a failure or a departure overrides an earlier READY (it died, or was
        preempted, while it waited)."""
        if slot not in self._members:
            return
        if slot in self._states and not (state in (FAILURE, LEFT) and self._states[slot] == READY):
            return
        log.debug("record state: %s = %s", slot, state)
        self._states[slot] = state

    def state(self, slot: str) -> Optional[str]:
        return self._states.get(slot)

    def count(self, state: str) -> int:
        return sum(1 for s in self._states.values() if s == state)

    def get(self, state: str) -> List[str]:
        return sorted(slot for slot, s in self._states.items() if s == state)

    def unrecorded(self) -> List[str]:
        """The workers of the round that have no state yet."""
        return sorted(self._members - set(self._states))

    def all_recorded(self) -> bool:
        return not self.unrecorded()

    @property
    def size(self) -> int:
        return len(self._members)

    def decide(self) -> Decision:
        """Once every worker has a state: blacklist the failed workers' hosts and say what happens next."""
        if self.count(SUCCESS) > 0:
            log.info("success count == %d -> stop running", self.count(SUCCESS))
            return Decision.FINISH
        if self.count(READY) == 0:
            if self.count(FAILURE) == 0:
                log.error("every worker of the round left (preempted) -> stop running")
                return Decision.ALL_LEFT
            log.error("failure count == %d -> stop running", self.count(FAILURE))
            return Decision.FAIL
        for slot in self.get(FAILURE):
            self._host_manager.blacklist(self._hosts[slot])
        if all(self._host_manager.is_blacklisted(self._hosts[slot]) for slot, state in self._states.items()
               if state != LEFT):
            log.error("blacklisted slots count == %d -> stop running", self.size)
            return Decision.FAIL
        if self._reset_limit is not None and self.reset_count >= self._reset_limit:
            log.error("reset count %d has exceeded limit %d -> stop running", self.reset_count, self._reset_limit)
            return Decision.RESET_LIMIT
        self.reset_count += 1
        return Decision.RESET

    def reset_limit_message(self) -> str:
        return constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(self._reset_limit)
