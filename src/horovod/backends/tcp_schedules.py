"""The tcp data plane's schedules: who exchanges which part of the buffer with whom at each step, and which
algorithm a collective uses. Pure functions of (rank, size, element count); :mod:`horovod.backends.tcp` runs them.

Allreduce algorithms (``HOROVOD_TCP_ALLREDUCE_ALGORITHM``):

- ``ring``: reduce-scatter then allgather around the ring; 2(n-1) steps, each rank sends 2(n-1)/n of the buffer.
  Bandwidth-optimal; tcp.py pipelines it in chunks.
- ``direct``: every rank sends its whole buffer to every other one, in n-1 rounds; each rank then reduces the n
  buffers in rank order.
- ``recursive_doubling``: log2(p) rounds; in each, partners swap their whole (partially reduced) buffers.
- ``rabenseifner``: reduce-scatter by recursive halving (log2(p) rounds, halving the part exchanged each time),
  then allgather by recursive doubling: 2 log2(p) rounds, each rank sends 2(p-1)/p of the buffer.

The last two work on a power-of-two core of p ranks. With n = p + q ranks (0 < q < p), ranks 0, 2, .., 2q-2 first
hand their buffer to the next (odd) rank, which reduces it into its own, sit out the core, and get the result back
from that rank at the end (MPICH's fold). Core position c is rank 2c+1 for c < q and rank c+q after.

Combining is always ``lower (op) higher``: the operand from the lower ranks is on the left, on both partners, so
that both compute the same bits even for ops whose result's bits depend on the order (a NaN's payload, the sign of
a zero under Min/Max). Every rank therefore ends with bitwise-identical results.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from horovod.backends.blocks import offsets, split_counts

ALLREDUCE_ALGORITHMS = ("auto", "ring", "direct", "recursive_doubling", "rabenseifner")
BROADCAST_ALGORITHMS = ("auto", "binomial", "pipeline")

Range = Tuple[int, int]          # [lo, hi) in elements
EMPTY: Range = (0, 0)


@dataclasses.dataclass(frozen=True)
class Step:
    """One exchange with ``peer`` (a rank of the group): send ``buf[send]`` while receiving ``recv`` elements.

    With ``reduce`` the received elements are combined into ``buf[recv]`` (``peer_first``: the peer's elements are
    the left operand); without, they are written straight into ``buf[recv]``. An empty range sends or receives
    nothing.
    """

    peer: int
    send: Range
    recv: Range
    reduce: bool
    peer_first: bool = False


def core_size(size: int) -> int:
    """The largest power of two not above ``size`` (``size`` >= 1)."""
    return 1 << (size.bit_length() - 1)


def core_position(rank: int, size: int) -> Optional[int]:
    """``rank``'s position in the power-of-two core, or None for a rank folded into its neighbour."""
    extra = size - core_size(size)
    if rank < 2 * extra:
        return rank // 2 if rank % 2 else None
    return rank - extra


def core_rank(position: int, size: int) -> int:
    """The rank at core ``position``."""
    extra = size - core_size(size)
    return 2 * position + 1 if position < extra else position + extra


def _fold(rank: int, size: int, count: int) -> Tuple[List[Step], List[Step]]:
    """The steps before and after the core for ``rank``: hand the buffer in / get the result back."""
    whole = (0, count)
    if core_position(rank, size) is None:
        return [Step(rank + 1, whole, EMPTY, False)], [Step(rank + 1, EMPTY, whole, False)]
    if rank < 2 * (size - core_size(size)):
        return [Step(rank - 1, EMPTY, whole, True, peer_first=True)], [Step(rank - 1, whole, EMPTY, False)]
    return [], []


def recursive_doubling(rank: int, size: int, count: int) -> List[Step]:
    """Allreduce of ``count`` elements by recursive doubling, for ``rank`` of ``size`` (fold included)."""
    before, after = _fold(rank, size, count)
    position = core_position(rank, size)
    steps = list(before)
    if position is not None:
        p, mask = core_size(size), 1
        while mask < p:
            partner = position ^ mask
            steps.append(Step(core_rank(partner, size), (0, count), (0, count), True, peer_first=partner < position))
            mask <<= 1
    return steps + after


def rabenseifner(rank: int, size: int, count: int) -> List[Step]:
    """Allreduce of ``count`` elements by recursive halving then doubling, for ``rank`` of ``size`` (fold included).

    The core's buffer is cut into p blocks (:func:`split_counts`); core position c ends the halving owning block c.
    """
    before, after = _fold(rank, size, count)
    position = core_position(rank, size)
    if position is None:
        return before + after
    p = core_size(size)
    starts = offsets(split_counts(count, p)) + [count]
    halving: List[Step] = []
    lo, hi, mask = 0, p, p >> 1
    while mask:
        mid = (lo + hi) // 2
        partner = position ^ mask
        keep, give = ((lo, mid), (mid, hi)) if position & mask == 0 else ((mid, hi), (lo, mid))
        halving.append(Step(core_rank(partner, size), (starts[give[0]], starts[give[1]]),
                            (starts[keep[0]], starts[keep[1]]), True, peer_first=partner < position))
        lo, hi = keep
        mask >>= 1
    # The allgather retraces the halving backwards: send what was kept, receive what was given.
    doubling = [Step(s.peer, s.recv, s.send, False) for s in reversed(halving)]
    return before + halving + doubling + after


def ring(rank: int, size: int, reduce_scatter: bool, allgather: bool) -> List[Tuple[int, int, bool]]:
    """The ring's steps for ``rank``: (block sent to rank+1, block received from rank-1, reduce it).

    The reduce-scatter leaves block ``rank`` reduced on ``rank``; the allgather starts from there. Each step
    sends the block the step before received, which is what lets tcp.py forward chunks as they arrive.
    """
    steps: List[Tuple[int, int, bool]] = []
    if reduce_scatter:
        steps += [((rank - s - 1) % size, (rank - s - 2) % size, True) for s in range(size - 1)]
    if allgather:
        steps += [((rank - s) % size, (rank - s - 1) % size, False) for s in range(size - 1)]
    return steps


def direct(rank: int, size: int) -> List[Tuple[int, int]]:
    """The direct exchange's rounds for ``rank``: (rank sent to, rank received from)."""
    return [((rank + k) % size, (rank - k) % size) for k in range(1, size)]


def ring_rounds(size: int) -> int:
    """Latency steps of the ring allreduce."""
    return 2 * (size - 1)


def doubling_rounds(size: int) -> int:
    """Latency steps of recursive doubling (two more when the rank count is not a power of two)."""
    p = core_size(size)
    return p.bit_length() - 1 + (2 if p != size else 0)


def choose_allreduce(size: int, nbytes: int, small_bytes: int, ring_bytes: int, forced: str = "auto") -> str:
    """The allreduce algorithm for ``nbytes`` over ``size`` ranks (``forced`` unless it is ``auto``).

    - up to ``small_bytes``: the fewest latency steps: ``direct`` (n-1 rounds) unless ``recursive_doubling``
      has fewer (from 4 ranks on, but 5);
    - up to ``ring_bytes``, on a power of two of at least 4 ranks: ``rabenseifner`` (ring's bandwidth in
      2 log2(n) steps instead of 2(n-1)); with other counts the fold would move the whole buffer twice more, which
      costs more than the steps it saves;
    - larger: the pipelined ``ring``.
    """
    if forced != "auto":
        return forced
    if nbytes <= small_bytes:
        return "direct" if size - 1 <= doubling_rounds(size) else "recursive_doubling"
    if nbytes < ring_bytes and size >= 4 and core_size(size) == size:
        return "rabenseifner"
    return "ring"


def binomial_rounds(size: int) -> int:
    """Rounds of the binomial-tree broadcast: ceil(log2(size))."""
    return (size - 1).bit_length()


def choose_broadcast(size: int, nbytes: int, chunk_bytes: int, forced: str = "auto") -> str:
    """The broadcast algorithm (``forced`` unless it is ``auto``).

    A binomial tree sends the whole buffer ceil(log2 n) times in a row on the critical path; the pipeline (a chain
    from the root, forwarding each chunk as soon as it arrives) takes about ``nbytes + (n-2) chunk``. The pipeline
    is chosen where that is less: (rounds - 1) nbytes > (n - 2) chunk.
    """
    if forced != "auto":
        return forced
    if size <= 2 or chunk_bytes <= 0:
        return "binomial"
    return "pipeline" if (binomial_rounds(size) - 1) * nbytes > (size - 2) * chunk_bytes else "binomial"


def binomial_tree(rank: int, size: int, root: int) -> Tuple[Optional[int], List[int]]:
    """``rank``'s parent (None at the root) and children, in sending order, in the binomial tree from ``root``."""
    vrank = (rank - root) % size
    parent, mask = None, 1
    while mask < size:
        if vrank & mask:
            parent = (vrank - mask + root) % size
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if vrank + mask < size:
            children.append((vrank + mask + root) % size)
        mask >>= 1
    return parent, children


def chain(rank: int, size: int, root: int) -> Tuple[Optional[int], Optional[int]]:
    """``rank``'s predecessor and successor on the pipeline broadcast's chain ``root, root+1, ...``."""
    vrank = (rank - root) % size
    before = None if vrank == 0 else (rank - 1) % size
    after = None if vrank == size - 1 else (rank + 1) % size
    return before, after
