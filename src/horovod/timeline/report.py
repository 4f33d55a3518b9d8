"""Render a :class:`~horovod.timeline.summary.Summary` as plain-text tables for a person to read."""
from __future__ import annotations

import datetime
from typing import List, Optional, Sequence

from horovod.timeline.summary import CATEGORIES, CATEGORY_LABELS, Summary, activity_category, format_duration

_NAME_WIDTH = 48


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def shorten_name(name: str, width: int = _NAME_WIDTH) -> str:
    """Cut the middle out of a long tensor name, keeping its distinctive end."""
    if len(name) <= width:
        return name
    keep = width - 3
    return name[: keep // 3] + "..." + name[len(name) - (keep - keep // 3):]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str, indent: str = "  ") -> List[str]:
    """Columns padded to their widest cell; ``align`` has one letter per column, ``l`` (left) or ``r`` (right)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = []
    for row in [headers, *rows]:
        cells = [str(cell).ljust(width) if side == "l" else str(cell).rjust(width)
                 for cell, width, side in zip(row, widths, align)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _start_time(summary: Summary) -> Optional[str]:
    if summary.start_time_since_epoch_us is None:
        return None
    try:
        moment = datetime.datetime.fromtimestamp(summary.start_time_since_epoch_us / 1e6, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _overview(summary: Summary) -> List[str]:
    lines = [f"Horovod timeline: {summary.source}" if summary.source else "Horovod timeline"]
    started = _start_time(summary)
    span = (f"wall span {format_duration(summary.span_us)} (ts {format_duration(summary.span_start_us)} "
            f"to {format_duration(summary.span_end_us)})")
    lines.append(f"  {span}, recording started {started}" if started else f"  {span}")
    lines.append(f"  {summary.tensor_count} tensors, {summary.ops} operations in {summary.collectives} collectives "
                 f"(fused tensors counted once), {summary.negotiations} negotiations")
    lines.append(f"  {summary.ranks} ranks seen in ready ticks, {summary.cycles} cycle markers")
    if summary.span_us:
        lines.append(f"  a collective was running {_pct(summary.op_busy_us, summary.span_us)} of the span, "
                     f"a negotiation was pending {_pct(summary.negotiate_busy_us, summary.span_us)} of it")
    lines.extend(f"  note: {note}" for note in summary.notes)
    return lines


def _op_types(summary: Summary) -> List[str]:
    if not summary.op_types:
        return ["No completed negotiation or operation in the file yet."]
    headers = ["op", "ops", "collectives", "negotiate total", "mean", "op total", "mean",
               *(CATEGORY_LABELS[category] for category in CATEGORIES)]
    rows = []
    for stats in summary.op_types:
        negotiated = bool(stats.negotiations)
        ran = bool(stats.ops)
        rows.append([stats.op, str(stats.ops), str(stats.collectives),
                     format_duration(stats.negotiate_total_us) if negotiated else "-",
                     format_duration(stats.negotiate_mean_us) if negotiated else "-",
                     format_duration(stats.op_total_us) if ran else "-",
                     format_duration(stats.op_mean_us) if ran else "-",
                     *(f"{stats.split_pct[category]:.1f}%" if ran else "-" for category in CATEGORIES)])
    lines = ["Time by operation type (totals add up every tensor's time; means are per tensor operation;",
             "the op time is split into queue / memcpy / data plane / other, in % of the op time)"]
    lines.extend(_table(headers, rows, "l" + "r" * (len(headers) - 1)))
    if summary.activities_us:
        op_total = sum(stats.op_total_us for stats in summary.op_types)
        lines += ["", "Op time by activity (all operation types)"]
        rows = [[name, CATEGORY_LABELS[activity_category(name)], format_duration(spent), _pct(spent, op_total)]
                for name, spent in summary.activities_us.items()]
        covered = sum(summary.activities_us.values())
        if op_total > covered:
            rows.append(["(no activity)", "other", format_duration(op_total - covered),
                         _pct(op_total - covered, op_total)])
        lines.extend(_table(["activity", "part", "total", "share"], rows, "llrr"))
    return lines


def _tensors(summary: Summary, top: Optional[int]) -> List[str]:
    if not summary.tensors:
        return []
    shown = summary.tensors[:top] if top else summary.tensors
    title = (f"Slowest tensors (top {len(shown)} of {len(summary.tensors)} by negotiation + op time)"
             if len(shown) < len(summary.tensors) else
             f"Tensors by negotiation + op time ({len(shown)})")
    rows = []
    for index, tensor in enumerate(shown, 1):
        dominant = "-"
        if tensor.dominant_activity:
            dominant = f"{tensor.dominant_activity} ({tensor.dominant_activity_pct:.0f}%)"
        rows.append([str(index), shorten_name(tensor.name), str(max(tensor.ops, tensor.negotiations)),
                     format_duration(tensor.total_us), format_duration(tensor.negotiate_mean_us),
                     format_duration(tensor.op_mean_us), dominant])
    headers = ["#", "tensor", "count", "total", "mean negotiate", "mean op", "dominant activity (% of op time)"]
    return [title, *_table(headers, rows, "rlrrrrl")]


def _stragglers(summary: Summary) -> List[str]:
    lines = ["Stragglers (from the ready ticks: which rank reported each tensor ready last, and by how much",
             "it trailed the rank before it)"]
    if not summary.straggler_negotiations:
        return lines + ["  no negotiation with ready ticks from two or more ranks."]
    rows = [[str(stats.rank), str(stats.negotiations), str(stats.times_last), f"{100.0 * stats.last_share:.1f}%",
             format_duration(stats.lag_total_us), format_duration(stats.lag_mean_us) if stats.times_last else "-"]
            for stats in summary.stragglers]
    lines.extend(_table(["rank", "negotiations", "last", "share", "lag total", "lag mean"], rows, "rrrrrr"))
    if summary.straggler_ties:
        lines.append(f"  {summary.straggler_ties} of {summary.straggler_negotiations} negotiations had two or more "
                     f"ranks last at the same time; they count for no rank.")
    return lines


def format_report(summary: Summary, top: Optional[int] = 10) -> str:
    """The whole text report; ``top`` limits the tensor table (None or 0: every tensor)."""
    sections = [_overview(summary), _op_types(summary), _tensors(summary, top), _stragglers(summary),
                [summary.verdict]]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"
