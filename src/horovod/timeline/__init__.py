"""Read and summarize Horovod timelines (the Chrome-tracing JSON that rank 0 writes to ``HOROVOD_TIMELINE``).

``python -m horovod.timeline summary FILE`` prints where the time went; from Python::

    from horovod.timeline import summarize_file, format_report
    print(format_report(summarize_file("timeline.json")))

Recording lives in the engine; this package only reads, and imports nothing heavy (matplotlib only for plots).
"""
from __future__ import annotations

from horovod.timeline.reader import (
    LoadedTimeline,
    TimelineError,
    load_events,
    load_timeline,
    parse_timeline_text,
)
from horovod.timeline.report import format_report
from horovod.timeline.summary import (
    OpTypeStats,
    RankStats,
    Summary,
    TensorStats,
    activity_category,
    format_duration,
    summarize,
    summarize_file,
)

__all__ = [
    "LoadedTimeline",
    "OpTypeStats",
    "RankStats",
    "Summary",
    "TensorStats",
    "TimelineError",
    "activity_category",
    "format_duration",
    "format_report",
    "load_events",
    "load_timeline",
    "parse_timeline_text",
    "summarize",
    "summarize_file",
]
