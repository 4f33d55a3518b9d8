"""The job's folder of flight records, from the launcher's side.

The launcher chooses the folder once per job (``HOROVOD_FLIGHT_RECORDER_DIR``, unless the user set it) and hands
it to every rank, so that all of them write into one place. When a rank fails, the others usually abort a moment
later and write their records: the launcher gives them up to ``WAIT_SECONDS`` to do so before it stops them
(:func:`await_records`), and its failure message names the folder when ranks wrote into it during this job
(:func:`failure_note`).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Dict, List, MutableMapping, Optional, Sequence

from horovod.common import flight_records

log = logging.getLogger(__name__)

WAIT_SECONDS = 1.0          # at most this long for the surviving ranks' records after a failure
FRESH_SECONDS = 5.0         # a record this much older than the failure was written before it (SIGUSR1)
_job: Dict[str, float] = {}     # the folder of the job this launcher runs -> when the job started


def choose(env: MutableMapping[str, str]) -> Optional[str]:
    """Set ``HOROVOD_FLIGHT_RECORDER_DIR`` in ``env`` (the ranks' environment): the user's folder, made absolute,
    else a fresh ``./horovod-flight/<date>-<time>-<id>``. Returns it (None when the recorder is off)."""
    try:
        if not flight_records.enabled(env):
            return None
    except ValueError:
        return None             # the ranks report the bad value themselves
    given = env.get(flight_records.DIR_ENV)
    folder = os.path.abspath(given) if given else flight_records.new_job_folder()
    env[flight_records.DIR_ENV] = folder
    _job.clear()
    _job[folder] = time.time()
    return folder


def current() -> Optional[str]:
    """The folder chosen for the job this launcher runs (None before one is chosen)."""
    return next(iter(_job), None)


def fresh_records(folder: Optional[str], since: float) -> Dict[int, str]:
    """The records in ``folder`` written at ``since`` or later, by rank."""
    if not folder:
        return {}
    fresh = {}
    for rank, path in flight_records.record_files(folder).items():
        try:
            if os.path.getmtime(path) >= since:
                fresh[rank] = path
        except OSError:
            pass
    return fresh


def failure_note() -> str:
    """What the failure message adds when ranks wrote flight records during this job (else nothing)."""
    folder = current()
    ranks = sorted(fresh_records(folder, _job.get(folder, 0.0) - 1.0)) if folder else []
    if not ranks:
        return ""
    return (f"\nFlight records of ranks {', '.join(map(str, ranks))}: {folder} "
            f"(compare them with: python -m horovod.timeline flight {folder})")


def await_records(workers: Sequence, failed_returncode: int, wait: float = WAIT_SECONDS) -> None:
    """After a rank failed, give the ranks still running up to ``wait`` seconds to write their flight records
    (they abort when they lose a peer, and write before they exit); returns as soon as each of them exited or
    wrote one. Only when records are being written: some rank already wrote one, or the failed rank was killed by
    a signal (its peers then surely abort). ``workers`` have ``spec`` (rank, env) and ``proc``."""
    folder = next((w.spec.env.get(flight_records.DIR_ENV) for w in workers
                   if w.spec.env.get(flight_records.DIR_ENV)), None)
    if not folder or wait <= 0:
        return
    now = time.time()
    since = now - FRESH_SECONDS
    killed = failed_returncode < 0 and failed_returncode != -signal.SIGTERM
    if not killed and not fresh_records(folder, since):
        return
    deadline = time.monotonic() + wait
    waiting: List = [w for w in workers if w.proc.poll() is None]
    while waiting and time.monotonic() < deadline:
        written = fresh_records(folder, since)
        waiting = [w for w in waiting if w.proc.poll() is None and w.spec.rank not in written]
        if waiting:
            time.sleep(0.02)
    if waiting:
        log.debug("ranks %s wrote no flight record within %.1f s", [w.spec.rank for w in waiting], wait)
