"""``horovodrun --monitor-port PORT``: a live page of the job, served by the launcher.

Per rank: host, pid, state, collectives and bytes per second, the collective it runs and how long it has waited
for whom, the last completed sequence number and the age of its heartbeat; the ranks' latest stall, deadlock and
data-plane reports; an elastic job's round and members; and a button that takes every rank's Python stack. The
data comes from the heartbeats the ranks put into the job's rendezvous store once a second, read inside the
launcher (:mod:`.status`); :mod:`.server` serves it behind a random token, :mod:`.page` is the page.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

from .server import Monitor
from .status import BeatLog, JobStatus, JobView, static_view

__all__ = ["BeatLog", "JobStatus", "Monitor", "serving", "start", "static_view"]

log = logging.getLogger(__name__)


def start(store, job: JobView, port: int, address: str = "127.0.0.1") -> Monitor:
    """Serve the live page of the job whose rendezvous store is ``store`` (the launcher's own
    :class:`horovod.common.kvstore.KVStoreServer`) on ``address:port`` (0: a free port), and log its URL."""
    monitor = Monitor(JobStatus(store, job), address, port)
    url = monitor.start()
    log.info("Live page of the job: %s", url)
    return monitor


@contextlib.contextmanager
def serving(settings, store, job: JobView) -> Iterator[Optional[Monitor]]:
    """The live page while the block runs, when ``settings.monitor_port`` is set (else nothing); stopped after.
    A port that cannot be bound ends the launch with OSError before any rank starts."""
    port = getattr(settings, "monitor_port", None)
    if port is None:
        yield None
        return
    try:
        monitor = start(store, job, int(port), getattr(settings, "monitor_address", None) or "127.0.0.1")
    except OSError as exc:
        raise OSError(f"The live page cannot listen on {settings.monitor_address}:{port} (--monitor-port, "
                      f"--monitor-address, HOROVOD_MONITOR_PORT): {exc}") from exc
    try:
        yield monitor
    finally:
        monitor.stop()
