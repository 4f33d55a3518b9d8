"""The timeline: a Chrome-tracing JSON file, written by rank 0, that shows each tensor's negotiation and
execution (upstream Horovod's format; open it in Perfetto or chrome://tracing).

Each tensor is a "process" row. Per operation it gets ``NEGOTIATE_<OP>`` (with an instant tick per rank as
that rank's request reaches the coordinator), then the op itself with nested activities: ``QUEUE`` while the
coordinator holds the ready tensor back to fuse it, the copies into and out of the fusion buffer, and the data
plane's own op (``SHM_ALLREDUCE``, ``MPI_BCAST``...).

Recording costs the engine thread one tuple append per event; a writer thread formats and writes them. When an
op completes, the engine wakes the writer (:meth:`Timeline.flush_soon`), so the op is in the file within a few
milliseconds; ops that complete while the writer writes, or within ``_GATHER_SECONDS`` after, go into its next
write together, which bounds the number of writes in a tight loop of ops. Events of ops still running are
written at least every ``_FLUSH_SECONDS``. After every batch the file ends with ``]``, written in the same
``write`` as the events, so the file is valid JSON at every moment and can be read
(``python -m horovod.timeline summary``) while the job runs.

Data planes mark their activities with :func:`activity`, which is a no-op unless this process is recording.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

log = logging.getLogger(__name__)

# Event kinds in the queue (the writer turns them into JSON).
_NEGOTIATE_START, _RANK_READY, _END, _BEGIN, _END_ARGS, _CYCLE = range(6)
_FLUSH_SECONDS = 0.2         # the longest an event waits to be written
_GATHER_SECONDS = 0.01       # after a write, the writer lets what completes meanwhile gather for this long


class _NullActivity:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NULL = _NullActivity()


class _Activity:
    __slots__ = ("timeline", "names", "label")

    def __init__(self, timeline: Timeline, names: List[str], label: str) -> None:
        self.timeline, self.names, self.label = timeline, names, label

    def __enter__(self) -> None:
        self.timeline.begin(self.names, self.label)

    def __exit__(self, *exc) -> None:
        self.timeline.end(self.names)


class _Batch(threading.local):
    """What is executing now on the recording rank: the activities of a data plane apply to these tensors. Each
    engine thread (one per process set) has its own."""

    timeline: Optional[Timeline] = None
    names: List[str] = []


_batch = _Batch()


def activity(label: str):
    """Context manager marking a nested activity (e.g. ``MEMCPY_IN_FUSION_BUFFER``) of the executing batch."""
    timeline = _batch.timeline
    if timeline is None:
        return _NULL
    return _Activity(timeline, _batch.names, label)


def executing(timeline: Optional[Timeline], names: List[str]) -> None:
    """Set (or, with None, clear) the batch that :func:`activity` marks. Called by the engine thread."""
    _batch.names = names
    _batch.timeline = timeline


class Timeline:
    """One timeline file being recorded; every method but :meth:`close` is called by engine threads (the global
    set's and those of the process sets this rank coordinates: events are queued on a thread-safe deque)."""

    def __init__(self, path: str, mark_cycles: bool = False) -> None:
        self.path = path
        self.mark_cycles = mark_cycles
        self._t0 = time.perf_counter_ns()
        self._events: Deque[Tuple] = deque()
        self._pids: Dict[str, int] = {}
        self._due = threading.Event()        # set when an op completed (or on close): write now
        self._closing = False
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._file = open(path, "wb")   # closed by the writer thread
        header = [{"name": "process_name", "ph": "M", "pid": 0,
                   "args": {"name": "Horovod", "start_time_since_epoch_in_micros": int(time.time() * 1e6)}},
                  {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}]
        self._end = 0
        self._append(("[\n" + ",\n".join(json.dumps(e) for e in header)).encode())
        self._thread = threading.Thread(target=self._writer, name="horovod-timeline", daemon=True)
        self._thread.start()
        log.info("timeline: recording to %s%s", path, " (with cycle markers)" if mark_cycles else "")

    # ----------------------------------------------------------------- recording (engine thread)
    def _put(self, event: Tuple) -> None:
        self._events.append(event)

    def negotiate_start(self, name: str, op_name: str) -> None:
        self._put((_NEGOTIATE_START, time.perf_counter_ns(), name, op_name))

    def rank_ready(self, name: str, rank: int) -> None:
        self._put((_RANK_READY, time.perf_counter_ns(), name, rank))

    def negotiate_end(self, name: str) -> None:
        self._put((_END, time.perf_counter_ns(), name))

    def begin(self, names: Iterable[str], label: str) -> None:
        now = time.perf_counter_ns()
        for name in names:
            self._put((_BEGIN, now, name, label))

    def end(self, names: Iterable[str]) -> None:
        now = time.perf_counter_ns()
        for name in names:
            self._put((_END, now, name))

    def end_op(self, name: str, dtype: str, shape: Iterable[int], now: Optional[int] = None) -> None:
        """Close ``name``'s op; tensors fused into one collective pass the same ``now`` (perf_counter_ns)."""
        self._put((_END_ARGS, time.perf_counter_ns() if now is None else now, name, dtype, list(shape)))

    def end_error(self, name: str, message: str) -> None:
        self._put((_END_ARGS, time.perf_counter_ns(), name, "error", message))

    def cycle(self) -> None:
        if self.mark_cycles:
            self._put((_CYCLE, time.perf_counter_ns()))

    def flush_soon(self) -> None:
        """Ops completed: have the writer write what is recorded now instead of at its next periodic flush."""
        due = self._due
        if not due.is_set():
            due.set()

    # ----------------------------------------------------------------- writing (writer thread)
    def close(self) -> None:
        """Write everything recorded so far and close the file (the timeline stays valid JSON); idempotent."""
        if self._closing:
            return
        self._closing = True
        self._due.set()
        self._thread.join(10.0)
        log.info("timeline: %s closed", self.path)

    def _writer(self) -> None:
        try:
            due = self._due
            while True:
                due.wait(_FLUSH_SECONDS)
                due.clear()                 # before writing: a completion from now on triggers the next write
                closing = self._closing
                self._write_pending()
                if closing:
                    return
                time.sleep(_GATHER_SECONDS)
        except Exception:
            log.exception("timeline: writing %s failed; the timeline stops here", self.path)
        finally:
            self._file.close()

    def _write_pending(self) -> None:
        events = self._events
        if not events:
            return
        lines: List[str] = []
        while events:
            lines.extend(self._format(events.popleft()))
        self._append((",\n" + ",\n".join(lines)).encode())

    def _append(self, data: bytes) -> None:
        """Write ``data`` over the closing ``]`` and close the list again, in one write: a reader never sees
        the events without the ``]`` after them."""
        self._file.seek(self._end)
        self._file.write(data + b"\n]\n")
        self._file.flush()
        self._end += len(data)

    def _pid(self, name: str, out: List[str]) -> int:
        pid = self._pids.get(name)
        if pid is None:
            pid = self._pids[name] = len(self._pids) + 1
            out.append(json.dumps({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}))
            out.append(json.dumps({"name": "process_sort_index", "ph": "M", "pid": pid,
                                   "args": {"sort_index": pid}}))
        return pid

    def _format(self, event: Tuple) -> List[str]:
        kind, ns = event[0], event[1]
        ts = (ns - self._t0) / 1000.0
        if kind == _CYCLE:
            return [f'{{"ph": "i", "name": "CYCLE_START", "ts": {ts:.3f}, "pid": 0, "s": "g"}}']
        out: List[str] = []
        pid = self._pid(event[2], out)
        if kind == _NEGOTIATE_START:
            out.append(f'{{"ph": "B", "name": "NEGOTIATE_{event[3]}", "ts": {ts:.3f}, "pid": {pid}}}')
        elif kind == _RANK_READY:
            out.append(f'{{"ph": "X", "name": "{event[3]}", "ts": {ts:.3f}, "pid": {pid}, "dur": 0}}')
        elif kind == _BEGIN:
            out.append(f'{{"ph": "B", "name": "{event[3]}", "ts": {ts:.3f}, "pid": {pid}}}')
        elif kind == _END:
            out.append(f'{{"ph": "E", "ts": {ts:.3f}, "pid": {pid}}}')
        elif kind == _END_ARGS:
            args = json.dumps({"error": event[4]} if event[3] == "error" else
                              {"dtype": event[3], "shape": str(event[4])})
            out.append(f'{{"ph": "E", "ts": {ts:.3f}, "pid": {pid}, "args": {args}}}')
        return out
