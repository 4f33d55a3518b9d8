"""Upstream's import path ``horovod.runner.common.util.timeout``: a deadline that names what timed out.

Upstream's launcher bounds its waits for task services with it; ours bounds them in place (``--start-timeout``),
so this is a small implementation with upstream's names, on the monotonic clock.
"""
from __future__ import annotations

import time


class TimeoutException(Exception):
    """An activity did not finish before its :class:`Timeout`; ``message`` says which."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class Timeout:
    """A deadline ``timeout`` seconds from now. ``message`` may name ``{activity}``, filled in by
    :meth:`check_time_out_for`."""

    def __init__(self, timeout: float, message: str) -> None:
        self._timeout = timeout
        self._timeout_at = time.monotonic() + timeout
        self._message = message

    def remaining(self) -> float:
        """Seconds left until the deadline (0 once it passed)."""
        return max(0.0, self._timeout_at - time.monotonic())

    def timed_out(self) -> bool:
        """True once the deadline passed."""
        return time.monotonic() > self._timeout_at

    def check_time_out_for(self, activity: str) -> None:
        """TimeoutException naming ``activity`` and the timeout when the deadline passed, else nothing."""
        if self.timed_out():
            text = self._message.format(activity=activity)
            raise TimeoutException(
                f"{text}{'' if text.rstrip().endswith('.') else '.'} Timeout after {self._timeout} seconds.")
