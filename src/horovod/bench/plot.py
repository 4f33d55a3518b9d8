"""One PNG with an algbw-vs-size panel per collective (log-log): ``python -m horovod.bench --plot`` and the
repo's benchmark scripts draw with it."""
from __future__ import annotations

from typing import Dict, List, Tuple

# op -> [(label, [(bytes, GB/s), ...], matplotlib style kwargs)]
Series = Dict[str, List[Tuple[str, List[Tuple[int, float]], dict]]]


def algbw_panels(series: Series, path: str, title: str) -> None:
    """Draw each op's series in its own panel and save the figure to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(series)
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, op in zip(axes, ops):
        for label, points, style in series[op]:
            points = sorted(points)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **({"marker": "o"} | style))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, {title}")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("algbw (GB/s)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
