"""How ZeRO-1 (``ZeroRedundancyOptimizer`` in ``horovod.torch`` and ``horovod.jax``) shards an optimizer over the
ranks of a process set: which rank owns each parameter, which parameters travel together in a bucket, and how a
bucket's flat buffer is laid out so that one reducescatter hands every rank exactly the reduced gradients of the
parameters it owns, and one allgather hands every rank all of them back.

Framework-free: a parameter is an index with a number of elements, an item size and a *kind* (anything
hashable that must agree within one flat buffer: the dtype and the device).

Layout of a bucket, for ``size`` ranks: rank r's parameters (in index order) are packed into the r-th
*segment*; every segment is as long as the longest (``segment``), the rest is padding. The buffer is
``size * segment`` elements, which a reducescatter splits into equal blocks (its rule gives ranks below
``n % size`` one more row, and ``n % size`` is 0 here), so rank r receives segment r.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

# A bucket closes once it holds at least the cap and its best split pads by at most this fraction; otherwise it
# takes more parameters (a parameter larger than a fair share cannot be balanced on its own).
MAX_PADDING = 0.10


@dataclass(frozen=True)
class Param:
    """What the layout needs to know of one parameter."""

    numel: int
    itemsize: int
    kind: Hashable


@dataclass
class Plan:
    """Owners of parameters and the buckets they travel in. ``loads[r]``: the elements rank r owns."""

    owners: Dict[int, int]
    buckets: List[List[int]]
    loads: List[int]


def _greedy(indices: Sequence[int], params: Sequence[Param], size: int,
            loads: Sequence[int]) -> Tuple[Dict[int, int], List[int]]:
    """Largest first, each to the rank with the least in this bucket (ties: the least overall, then the lowest
    rank). Returns the owners and the bucket's per-rank elements."""
    owners: Dict[int, int] = {}
    bucket = [0] * size
    for i in sorted(indices, key=lambda i: (-params[i].numel, i)):
        r = min(range(size), key=lambda r: (bucket[r], loads[r], r))
        owners[i] = r
        bucket[r] += params[i].numel
    return owners, bucket


def _padding(bucket: Sequence[int]) -> float:
    total = sum(bucket)
    return 0.0 if total == 0 else (len(bucket) * max(bucket) - total) / total


def plan(params: Sequence[Param], size: int, bucket_bytes: int, indices: Optional[Sequence[int]] = None,
         loads: Optional[Sequence[int]] = None) -> Plan:
    """Assign the parameters ``indices`` (default: all, in reverse order, which is about the order backward
    produces their gradients) to ``size`` ranks and to buckets of about ``bucket_bytes`` bytes.

    Buckets hold one kind each, consecutive in ``indices``' order; each is balanced on its own (its padding is
    the waste), with ties broken towards the ranks owning the least so far (``loads``, from earlier plans), so
    that the whole is balanced too.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    order = list(reversed(range(len(params)))) if indices is None else list(indices)
    loads = list(loads) if loads is not None else [0] * size
    owners: Dict[int, int] = {}
    buckets: List[List[int]] = []
    open_buckets: Dict[Hashable, List[int]] = {}
    open_bytes: Dict[Hashable, int] = {}

    def close(kind: Hashable, assigned: Optional[Dict[int, int]] = None) -> None:
        members = open_buckets.pop(kind)
        open_bytes.pop(kind)
        assigned = assigned if assigned is not None else _greedy(members, params, size, loads)[0]
        for i in members:
            owners[i] = assigned[i]
            loads[assigned[i]] += params[i].numel
        buckets.append(sorted(members))

    for i in order:
        kind = params[i].kind
        open_buckets.setdefault(kind, []).append(i)
        open_bytes[kind] = open_bytes.get(kind, 0) + params[i].numel * params[i].itemsize
        if open_bytes[kind] >= bucket_bytes:
            assigned, per_rank = _greedy(open_buckets[kind], params, size, loads)
            if _padding(per_rank) <= MAX_PADDING:
                close(kind, assigned)
    for kind in list(open_buckets):
        close(kind)
    return Plan(owners, buckets, loads)


@dataclass(frozen=True)
class BucketLayout:
    """One bucket's flat buffer for ``size`` ranks (see the module's docstring)."""

    per_rank: Tuple[Tuple[int, ...], ...]   # rank r's parameter indices, in buffer order
    segment: int                            # elements per rank in the padded buffer
    offsets: Dict[int, int]                 # parameter index -> offset inside its owner's segment
    used: Tuple[int, ...]                   # rank r's elements (segment minus padding)

    @property
    def numel(self) -> int:
        """Elements of the padded buffer: ``size * segment``."""
        return len(self.per_rank) * self.segment

    def padded_start(self, index: int, owner: int) -> int:
        """Where parameter ``index`` (owned by ``owner``) starts in the padded buffer."""
        return owner * self.segment + self.offsets[index]

    def packed_start(self, index: int, owner: int) -> int:
        """Where it starts when the segments are concatenated without padding (an allgather of ``used``)."""
        return sum(self.used[:owner]) + self.offsets[index]


def layout(indices: Sequence[int], owners: Dict[int, int], numels: Sequence[int], size: int) -> BucketLayout:
    """The layout of a bucket holding ``indices`` (``numels`` is indexed by parameter index)."""
    per_rank: List[List[int]] = [[] for _ in range(size)]
    for i in sorted(indices):
        per_rank[owners[i]].append(i)
    offsets: Dict[int, int] = {}
    used = []
    for members in per_rank:
        position = 0
        for i in members:
            offsets[i] = position
            position += numels[i]
        used.append(position)
    return BucketLayout(tuple(tuple(m) for m in per_rank), max(used) if used else 0, offsets, tuple(used))
