"""How a buffer splits into per-rank blocks: the layout helpers every data plane (and Adasum) shares."""
from __future__ import annotations

from typing import List, Sequence


def split_counts(n: int, parts: int) -> List[int]:
    """``n`` elements split into ``parts`` blocks, the first ``n % parts`` one larger."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def offsets(counts: Sequence[int]) -> List[int]:
    """Exclusive prefix sums: where block i starts."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out
