"""Draw a :class:`~horovod.timeline.summary.Summary` into a PNG with matplotlib (imported only when used).

The figure is drawn with the Agg canvas directly, without pyplot, so calling this from a notebook or a GUI
program does not change its matplotlib backend.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Union

from horovod.timeline.report import shorten_name
from horovod.timeline.summary import CATEGORIES, CATEGORY_LABELS, Summary, format_duration

_INSTALL_HINT = "--plot needs matplotlib, which is not installed here: pip install matplotlib"
_COLORS = {"negotiation": "#9e9e9e", "queue": "#f4a261", "memcpy": "#2a9d8f", "data_plane": "#264653",
           "other": "#e9c46a"}


class PlotError(Exception):
    """The figure cannot be drawn or saved; the message says why and what to do."""


def require_matplotlib() -> None:
    """Raise :class:`PlotError` naming ``pip install matplotlib`` if matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(_INSTALL_HINT) from None


def _op_types_panel(axes: Any, summary: Summary) -> None:
    names = [stats.op for stats in summary.op_types]
    bottoms = [0.0] * len(names)
    parts = [("negotiation", [stats.negotiate_mean_us / 1000 for stats in summary.op_types])]
    for category in CATEGORIES:
        parts.append((category, [stats.split_us[category] / stats.ops / 1000 if stats.ops else 0.0
                                 for stats in summary.op_types]))
    for key, values in parts:
        label = "negotiation" if key == "negotiation" else CATEGORY_LABELS[key]
        axes.bar(names, values, bottom=bottoms, label=label, color=_COLORS[key])
        bottoms = [bottom + value for bottom, value in zip(bottoms, values)]
    axes.set_title("Mean time per tensor operation")
    axes.set_ylabel("ms")
    axes.legend(fontsize="small")
    axes.tick_params(axis="x", labelrotation=30)


def _tensors_panel(axes: Any, summary: Summary, top: Optional[int]) -> None:
    shown = list(reversed(summary.tensors[:top] if top else summary.tensors))
    labels = [shorten_name(tensor.name, 40) for tensor in shown]
    negotiate = [tensor.negotiate_total_us / 1000 for tensor in shown]
    op_time = [tensor.op_total_us / 1000 for tensor in shown]
    positions = list(range(len(shown)))
    axes.barh(positions, negotiate, color=_COLORS["negotiation"], label="negotiation")
    axes.barh(positions, op_time, left=negotiate, color="#457b9d", label="op")
    axes.set_yticks(positions)
    axes.set_yticklabels(labels, fontsize="small")
    axes.set_title(f"Slowest {len(shown)} tensors (total time)")
    axes.set_xlabel("ms")
    axes.legend(fontsize="small")


def _stragglers_panel(axes: Any, summary: Summary) -> None:
    ranks = [str(stats.rank) for stats in summary.stragglers]
    shares = [100.0 * stats.last_share for stats in summary.stragglers]
    bars = axes.bar(ranks, shares, color=_COLORS["queue"])
    for bar, stats in zip(bars, summary.stragglers):
        if stats.times_last:
            axes.annotate(format_duration(stats.lag_mean_us), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize="small")
    axes.set_ylim(0, 105)
    axes.set_title("Last to report ready (label: mean lag)")
    axes.set_xlabel("rank")
    axes.set_ylabel("% of negotiations")


def plot_summary(summary: Summary, path: Union[str, os.PathLike[str]], top: Optional[int] = 10) -> None:
    """Write a PNG: mean time per op type by phase, the slowest tensors, and the last-to-submit ranks."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels: List[str] = ["op_types"] if summary.op_types else []
    if summary.tensors:
        panels.append("tensors")
    if summary.straggler_negotiations:
        panels.append("stragglers")
    shown = min(len(summary.tensors), top) if top else len(summary.tensors)
    figure = Figure(figsize=(6 * max(len(panels), 1), max(4.5, 1.5 + 0.3 * shown)), layout="constrained")
    FigureCanvasAgg(figure)
    if not panels:
        figure.text(0.5, 0.5, "No completed operation in this timeline", ha="center", va="center")
    axes = figure.subplots(1, len(panels), squeeze=False)[0] if panels else []
    for ax, panel in zip(axes, panels):
        if panel == "op_types":
            _op_types_panel(ax, summary)
        elif panel == "tensors":
            _tensors_panel(ax, summary, top)
        else:
            _stragglers_panel(ax, summary)
    if summary.source:
        figure.suptitle(os.path.basename(summary.source))
    try:
        figure.savefig(os.fspath(path), format="png", dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write the plot to {os.fspath(path)}: {exc.strerror or exc}.") from None
