"""A rank's last output lines, kept for the job-failure report, and the first lines of the last exception it raised.

A failed rank's last ten lines are usually its traceback, ending with the exception. A long exception message (a
stall report carries the silent peer's state and Python stack; an abort relays another rank's report) pushes its
own first lines, the ones that say what went wrong, out of those ten. So the tail also keeps, from the last Python
traceback it saw, the exception's first :data:`EXCEPTION_LINES` lines, and the report shows them when the last
lines do not.
"""
from __future__ import annotations

import collections
import re
from typing import Deque, Dict, List, Sequence

TAIL_LINES = 10
EXCEPTION_LINES = 4
_TRACEBACK = "Traceback (most recent call last):"
# The line that ends a traceback's frames: ``ValueError: ...``, ``horovod.common.exceptions.HorovodInternalError:
# ...`` or a bare ``KeyboardInterrupt``. Frame lines are indented; another thread's log line starts with "[".
_EXCEPTION_HEAD = re.compile(r"[A-Za-z_][\w.]*(?::\s|:$|$)")
# Where a chained exception's message ends (Python prints these between the tracebacks of a chain).
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")


def report_lines(rank: int, exception: Sequence[str], last_lines: Sequence[str]) -> List[str]:
    """A failure report's account of what ``rank`` printed: its exception's first lines (when given), then its
    last lines (or that it printed nothing)."""
    lines = []
    if exception:
        lines.append(f"The exception rank {rank} raised (its first lines):")
        lines.extend("    " + str(line) for line in exception)
    if last_lines:
        lines.append(f"Last {len(last_lines)} output lines of rank {rank}:")
        lines.extend("    " + str(line) for line in last_lines)
    else:
        lines.append(f"Rank {rank} printed nothing before it exited.")
    return lines


class OutputTail:
    """The last :data:`TAIL_LINES` lines of one rank (as shown), and its last exception's first lines.

    Each output stream is followed on its own (a traceback is written to one stream; the other's lines, from
    another thread of the launcher, do not interleave with it)."""

    def __init__(self) -> None:
        self.lines: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.exception: List[str] = []
        self._state: Dict[str, str] = {}     # per stream: "output", "frames" (in a traceback), "message" (its exception)
        self._message: Dict[str, List[str]] = {}

    def add(self, content: str, shown: str, stream: str = "stderr") -> None:
        """One more line of ``stream``: ``content`` as the rank printed it, ``shown`` as the console showed it."""
        self.lines.append(shown)
        state = self._state.get(stream, "output")
        if content.startswith(_TRACEBACK):
            state = "frames"
        elif state == "frames":
            if _EXCEPTION_HEAD.match(content):
                state, self._message[stream] = "message", [shown]
                self.exception = self._message[stream]
        elif state == "message":
            message = self._message[stream]
            if not content.strip() or content.startswith(_CHAIN) or len(message) >= EXCEPTION_LINES:
                state = "output"
            else:
                message.append(shown)
        self._state[stream] = state

    def unseen_exception(self) -> List[str]:
        """The exception's first lines when the last lines do not show them all (else nothing)."""
        shown = set(self.lines)
        return [] if all(line in shown for line in self.exception) else list(self.exception)
