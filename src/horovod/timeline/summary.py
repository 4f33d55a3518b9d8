"""Where the time went in a Horovod timeline: per op type, per tensor, and which rank held the others up.

:func:`summarize` turns the events of a timeline (see :mod:`horovod.timeline.reader`) into a :class:`Summary`.
Each tensor is a Chrome-tracing "process" (``pid`` 1, 2, ...). Per step it shows a ``NEGOTIATE_<TYPE>`` span
holding one ``X`` "ready tick" per rank (named by the rank), then an op span (``ALLREDUCE`` ...) holding nested
activities (``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``, ``SHM_ALLREDUCE`` ...). ``E`` events carry no name and close
the innermost open ``B`` of their pid.

Conventions used by every number here:

- Times are in microseconds, as in the file.
- Counts and totals are per *tensor operation*: a tensor fused with others into one collective counts its own
  negotiation and its own op time, which is the latency that tensor saw. ``collectives`` counts fused runs once.
- The op time of each operation is split into ``queue`` (``QUEUE``), ``memcpy`` (``MEMCPY_*`` and other copies),
  ``data_plane`` (the backend's own collective: ``SHM_ALLREDUCE``, ``MPI_BCAST`` ...) and ``other`` (any other
  activity, plus time inside the op that no activity covers). Only activities directly inside the op count.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from horovod.timeline.reader import Event, load_timeline

NEGOTIATE_PREFIX = "NEGOTIATE_"
CYCLE_START = "CYCLE_START"
CATEGORIES = ("queue", "memcpy", "data_plane", "other")
CATEGORY_LABELS = {"queue": "queue", "memcpy": "memcpy", "data_plane": "data plane", "other": "other"}
_COLLECTIVE_WORDS = ("ALLREDUCE", "ALLGATHER", "BCAST", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "REDUCE",
                     "BARRIER", "ADASUM", "GATHER", "SCATTER")


def activity_category(name: str) -> str:
    """Which part of the op time an activity belongs to: ``queue``, ``memcpy``, ``data_plane`` or ``other``."""
    if name == "QUEUE":
        return "queue"
    if "MEMCPY" in name or name.startswith("COPY_"):
        return "memcpy"
    if name.startswith("INIT_") or name.startswith("ALLOCATE_") or name.startswith("WAIT_"):
        return "other"
    if any(word in name for word in _COLLECTIVE_WORDS):
        return "data_plane"
    return "other"


def format_duration(us: float) -> str:
    """A duration in microseconds as a short human string, 3 significant digits: ``71.7 us``, ``3.2 ms``."""
    for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if abs(us) < 1000 * scale or unit == "s":
            text = f"{us / scale:.3g}"
            return f"{us / scale:.0f} {unit}" if "e" in text else f"{text} {unit}"
    raise AssertionError("unreachable")


@dataclass
class OpTypeStats:
    """Negotiation and op time of one request/response type (``ALLREDUCE``, ``BROADCAST`` ...)."""

    op: str
    ops: int = 0
    collectives: int = 0
    negotiations: int = 0
    negotiate_total_us: float = 0.0
    negotiate_mean_us: float = 0.0
    op_total_us: float = 0.0
    op_mean_us: float = 0.0
    split_us: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    split_pct: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    activities_us: Dict[str, float] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        return self.negotiate_total_us + self.op_total_us


@dataclass
class TensorStats:
    """One tensor across all the steps in the file."""

    name: str
    pid: int
    ops: int = 0
    negotiations: int = 0
    negotiate_total_us: float = 0.0
    negotiate_mean_us: float = 0.0
    op_total_us: float = 0.0
    op_mean_us: float = 0.0
    total_us: float = 0.0
    op_types: List[str] = field(default_factory=list)
    dominant_activity: Optional[str] = None
    dominant_activity_us: float = 0.0
    dominant_activity_pct: float = 0.0
    dtype: Optional[str] = None
    shape: Optional[str] = None
    activities_us: Dict[str, float] = field(default_factory=dict)


@dataclass
class RankStats:
    """How often one rank was the last to report a tensor ready, and by how much."""

    rank: int
    negotiations: int = 0
    times_last: int = 0
    last_share: float = 0.0
    lag_total_us: float = 0.0
    lag_mean_us: float = 0.0


@dataclass
class Summary:
    """The whole report; :meth:`to_dict` / :meth:`from_dict` convert it to and from plain JSON data."""

    source: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    start_time_since_epoch_us: Optional[float] = None
    span_start_us: float = 0.0
    span_end_us: float = 0.0
    span_us: float = 0.0
    tensor_count: int = 0
    ops: int = 0
    collectives: int = 0
    negotiations: int = 0
    cycles: int = 0
    ranks: int = 0
    open_at_end: int = 0
    op_busy_us: float = 0.0
    negotiate_busy_us: float = 0.0
    op_types: List[OpTypeStats] = field(default_factory=list)
    activities_us: Dict[str, float] = field(default_factory=dict)
    tensors: List[TensorStats] = field(default_factory=list)
    stragglers: List[RankStats] = field(default_factory=list)
    straggler_negotiations: int = 0
    straggler_ties: int = 0
    verdict: str = ""

    def to_dict(self, top: Optional[int] = None) -> Dict[str, Any]:
        """Plain JSON-able data; ``top`` keeps only the ``top`` slowest tensors (None or 0: all of them)."""
        data = asdict(self)
        if top:
            data["tensors"] = data["tensors"][:top]
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Summary:
        """Rebuild a :class:`Summary` from :meth:`to_dict` output (e.g. read back from ``--json``)."""
        values = dict(data)
        values["op_types"] = [OpTypeStats(**item) for item in data.get("op_types", [])]
        values["tensors"] = [TensorStats(**item) for item in data.get("tensors", [])]
        values["stragglers"] = [RankStats(**item) for item in data.get("stragglers", [])]
        return cls(**values)


@dataclass
class _Frame:
    """An open ``B`` event on one pid's stack."""

    name: str
    ts: float
    depth: int
    is_negotiation: bool
    ticks: Dict[int, float] = field(default_factory=dict)
    activities: Dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _rank(name: Any) -> Optional[int]:
    try:
        return int(str(name).strip())
    except ValueError:
        return None


def _union_length(intervals: Iterable[Tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


class _Accumulator:
    """Walks the events once, in file order, and keeps the running sums."""

    def __init__(self) -> None:
        self.stacks: Dict[int, List[_Frame]] = defaultdict(list)
        self.names: Dict[int, str] = {}
        self.start_time: Optional[float] = None
        self.span: Optional[Tuple[float, float]] = None
        self.cycles = 0
        self.stray_ends = 0
        self.malformed = 0
        self.op_types: Dict[str, OpTypeStats] = {}
        self.collectives: Dict[str, set] = defaultdict(set)
        self.tensors: Dict[int, TensorStats] = {}
        self.ranks: Dict[int, RankStats] = {}
        self.straggler_negotiations = 0
        self.straggler_ties = 0
        self.op_intervals: List[Tuple[float, float]] = []
        self.negotiate_intervals: List[Tuple[float, float]] = []

    def op_type(self, name: str) -> OpTypeStats:
        if name not in self.op_types:
            self.op_types[name] = OpTypeStats(op=name)
        return self.op_types[name]

    def tensor(self, pid: int) -> TensorStats:
        if pid not in self.tensors:
            self.tensors[pid] = TensorStats(name=self.names.get(pid, f"pid {pid}"), pid=pid)
        return self.tensors[pid]

    def see_time(self, ts: float) -> None:
        self.span = (ts, ts) if self.span is None else (min(self.span[0], ts), max(self.span[1], ts))

    def add(self, event: Event) -> None:
        phase = event.get("ph")
        if phase == "M":
            self.metadata(event)
            return
        ts = _number(event.get("ts"))
        if phase in ("i", "I", "R"):
            if event.get("name") == CYCLE_START:
                self.cycles += 1
            if ts is not None:
                self.see_time(ts)
            return
        if phase not in ("B", "E", "X"):
            return
        pid = event.get("pid")
        if ts is None or not isinstance(pid, int) or isinstance(pid, bool):
            self.malformed += 1
            return
        self.see_time(ts)
        stack = self.stacks[pid]
        if phase == "B":
            name = str(event.get("name", ""))
            stack.append(_Frame(name, ts, len(stack), not stack and name.startswith(NEGOTIATE_PREFIX)))
        elif phase == "E":
            if not stack:
                self.stray_ends += 1
                return
            frame = stack.pop()
            duration = max(0.0, ts - frame.ts)
            if frame.depth == 0:
                self.close_top(pid, frame, ts, event.get("args"))
            elif frame.depth == 1 and not stack[0].is_negotiation:
                stack[0].activities[frame.name] += duration
        else:
            self.complete_event(stack, event, ts)

    def complete_event(self, stack: List[_Frame], event: Event, ts: float) -> None:
        """An ``X`` event: a ready tick inside a negotiation, or a complete activity directly inside an op."""
        if not stack:
            return
        top = stack[0]
        if top.is_negotiation:
            rank = _rank(event.get("name"))
            if rank is not None and rank not in top.ticks:
                top.ticks[rank] = ts
            return
        duration = _number(event.get("dur"))
        if len(stack) == 1 and duration:
            top.activities[str(event.get("name", ""))] += max(0.0, duration)

    def metadata(self, event: Event) -> None:
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        pid = event.get("pid")
        start = _number(args.get("start_time_since_epoch_in_micros"))
        if start is not None and self.start_time is None:
            self.start_time = start
        if event.get("name") != "process_name" or not isinstance(pid, int):
            return
        if pid != 0 and isinstance(args.get("name"), str):
            self.names[pid] = args["name"]
            if pid in self.tensors:
                self.tensors[pid].name = args["name"]

    def close_top(self, pid: int, frame: _Frame, end: float, args: Any) -> None:
        duration = max(0.0, end - frame.ts)
        tensor = self.tensor(pid)
        if frame.is_negotiation:
            stats = self.op_type(frame.name[len(NEGOTIATE_PREFIX):] or frame.name)
            stats.negotiations += 1
            stats.negotiate_total_us += duration
            tensor.negotiations += 1
            tensor.negotiate_total_us += duration
            self.negotiate_intervals.append((frame.ts, end))
            self.stragglers(frame.ticks)
            return
        stats = self.op_type(frame.name)
        stats.ops += 1
        stats.op_total_us += duration
        self.collectives[frame.name].add(end)     # fused tensors' ops end together
        covered = {category: 0.0 for category in CATEGORIES}
        for name, spent in frame.activities.items():
            stats.activities_us[name] = stats.activities_us.get(name, 0.0) + spent
            tensor.activities_us[name] = tensor.activities_us.get(name, 0.0) + spent
            covered[activity_category(name)] += spent
        covered["other"] += max(0.0, duration - sum(covered.values()))
        for category, spent in covered.items():
            stats.split_us[category] += spent
        tensor.ops += 1
        tensor.op_total_us += duration
        if frame.name not in tensor.op_types:
            tensor.op_types.append(frame.name)
        if isinstance(args, dict):
            tensor.dtype = str(args["dtype"]) if "dtype" in args else tensor.dtype
            tensor.shape = str(args["shape"]) if "shape" in args else tensor.shape
        self.op_intervals.append((frame.ts, end))

    def stragglers(self, ticks: Dict[int, float]) -> None:
        """Credit the last rank to become ready with the time between it and the one before."""
        if len(ticks) < 2:
            return
        self.straggler_negotiations += 1
        for rank in ticks:
            self.ranks.setdefault(rank, RankStats(rank=rank)).negotiations += 1
        ordered = sorted(ticks.values())
        last, before = ordered[-1], ordered[-2]
        if last == before:
            self.straggler_ties += 1
            return
        rank = next(rank for rank, ts in ticks.items() if ts == last)
        self.ranks[rank].times_last += 1
        self.ranks[rank].lag_total_us += last - before


def summarize(events: Sequence[Event], source: Optional[str] = None,
              notes: Sequence[str] = ()) -> Summary:
    """Compute the report for a list of timeline events (in file order)."""
    acc = _Accumulator()
    for event in events:
        if isinstance(event, dict):
            acc.add(event)

    summary = Summary(source=source, notes=list(notes), start_time_since_epoch_us=acc.start_time,
                      cycles=acc.cycles)
    if acc.span is not None:
        summary.span_start_us, summary.span_end_us = acc.span
        summary.span_us = acc.span[1] - acc.span[0]

    for name, stats in acc.op_types.items():
        stats.collectives = len(acc.collectives.get(name, ()))
        stats.negotiate_mean_us = stats.negotiate_total_us / stats.negotiations if stats.negotiations else 0.0
        stats.op_mean_us = stats.op_total_us / stats.ops if stats.ops else 0.0
        for category in CATEGORIES:
            spent = stats.split_us[category]
            stats.split_pct[category] = 100.0 * spent / stats.op_total_us if stats.op_total_us else 0.0
        stats.activities_us = dict(sorted(stats.activities_us.items(), key=lambda item: (-item[1], item[0])))
        for activity, spent in stats.activities_us.items():
            summary.activities_us[activity] = summary.activities_us.get(activity, 0.0) + spent
    summary.activities_us = dict(sorted(summary.activities_us.items(), key=lambda item: (-item[1], item[0])))
    summary.op_types = sorted(acc.op_types.values(), key=lambda stats: (-stats.total_us, stats.op))

    for tensor in acc.tensors.values():
        tensor.negotiate_mean_us = tensor.negotiate_total_us / tensor.negotiations if tensor.negotiations else 0.0
        tensor.op_mean_us = tensor.op_total_us / tensor.ops if tensor.ops else 0.0
        tensor.total_us = tensor.negotiate_total_us + tensor.op_total_us
        if tensor.activities_us:
            name, spent = max(tensor.activities_us.items(), key=lambda item: (item[1], item[0]))
            tensor.dominant_activity, tensor.dominant_activity_us = name, spent
            tensor.dominant_activity_pct = 100.0 * spent / tensor.op_total_us if tensor.op_total_us else 0.0
        tensor.activities_us = dict(sorted(tensor.activities_us.items(), key=lambda item: (-item[1], item[0])))
    summary.tensors = sorted(acc.tensors.values(), key=lambda tensor: (-tensor.total_us, tensor.name))
    summary.tensor_count = len(set(acc.names) | set(acc.tensors))

    summary.ops = sum(stats.ops for stats in summary.op_types)
    summary.collectives = sum(stats.collectives for stats in summary.op_types)
    summary.negotiations = sum(stats.negotiations for stats in summary.op_types)
    summary.op_busy_us = _union_length(acc.op_intervals)
    summary.negotiate_busy_us = _union_length(acc.negotiate_intervals)

    for stats in acc.ranks.values():
        stats.last_share = stats.times_last / stats.negotiations if stats.negotiations else 0.0
        stats.lag_mean_us = stats.lag_total_us / stats.times_last if stats.times_last else 0.0
    summary.stragglers = sorted(acc.ranks.values(), key=lambda stats: stats.rank)
    summary.ranks = len(acc.ranks)
    summary.straggler_negotiations = acc.straggler_negotiations
    summary.straggler_ties = acc.straggler_ties
    for item in [summary, *summary.op_types, *summary.tensors, *summary.stragglers]:
        _round_floats(item)
    summary.verdict = _verdict(summary)

    summary.open_at_end = sum(1 for stack in acc.stacks.values() if stack)
    if summary.open_at_end:
        summary.notes.append(f"{summary.open_at_end} tensors still had a negotiation or an operation open at the "
                             f"end of the file (the job is still running, or was killed); those are left out.")
    if acc.stray_ends:
        summary.notes.append(f"ignored {acc.stray_ends} 'E' events that closed nothing (no open 'B' on their pid).")
    if acc.malformed:
        summary.notes.append(f"ignored {acc.malformed} events without a numeric 'ts' or an integer 'pid'.")
    return summary


def _round_floats(item: Any) -> None:
    """Round the times and percentages of one record to 3 decimals (ns), shares to 6, so JSON stays readable."""
    for name, value in vars(item).items():
        digits = 6 if name == "last_share" else 3
        if isinstance(value, float):
            setattr(item, name, round(value, digits))
        elif isinstance(value, dict) and all(isinstance(entry, float) for entry in value.values()):
            setattr(item, name, {key: round(entry, digits) for key, entry in value.items()})


def _verdict(summary: Summary) -> str:
    """One sentence on which rank holds the others up, if the ready ticks say so."""
    if not summary.straggler_negotiations:
        return ("No straggler information: no negotiation in the file has ready ticks from two or more ranks "
                "(a single-rank job, or a timeline without negotiation events).")
    worst = max(summary.stragglers, key=lambda stats: (stats.times_last, stats.lag_total_us, -stats.rank))
    if not worst.times_last:
        return (f"No rank was last on its own: in all {summary.straggler_ties} negotiations the last ranks "
                f"reported ready at the same time.")
    share = f"{100.0 * worst.last_share:.0f}%"
    detail = (f"rank {worst.rank} was last to submit {share} of the time, "
              f"on average {format_duration(worst.lag_mean_us)} after the others")
    if worst.last_share >= max(0.5, min(0.75, 2.0 / max(summary.ranks, 1))):
        return detail[0].upper() + detail[1:] + "."
    return f"No rank stands out: the last rank to submit varies ({detail})."


def summarize_file(path: Union[str, os.PathLike[str]]) -> Summary:
    """Load the timeline at ``path`` (tolerating a live or truncated file) and summarize it."""
    loaded = load_timeline(path)
    return summarize(loaded.events, source=loaded.source, notes=loaded.notes)
