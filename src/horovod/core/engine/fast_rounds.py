"""Fast rounds: a blocking collective that skips the coordinator when every rank is idle.

A lone small allreduce spends most of its time on hand-offs: the caller to the engine thread, the request to rank
0's engine thread and its answer back, a barrier on the data plane (docs/benchmarks.md, issue 15). When ranks
share a host (the shm plane), the caller can agree with its peers directly, through shared memory, and reduce
itself.

**Records.** Every submission on every rank posts one record into the rank's header in the shared area, under the
engine lock, numbered 1, 2, 3 ... per rank. A record is FAST (a key naming the op: tensor name, dtype, shape, op and
scale factors, and the input already copied into the rank's slot) when the op is one allreduce, reducescatter,
broadcast or allgather submitted by a call that waits for it at once, small enough for a slot (:func:`key_of`),
while the coordinator has emitted everything this rank submitted before; SLOW otherwise. Round k is *matched*
when every rank's k-th record is FAST with the same key: then every rank reduces (or copies) all slots, in rank
order, into its output, and no message is sent. Otherwise every rank whose k-th record was FAST
hands its op to the coordinator, as every other op goes. All ranks read the same k-th records, so they reach the
same verdict.

**Why a round always closes.** A rank posts FAST at record k only when the coordinator has emitted all its
earlier submissions. Each of those needed every peer's request, so each peer has at least k - 1 records. A peer
with exactly k - 1 has had everything it submitted emitted too, so nothing it waits on needs the waiting rank's
caller (its engine thread runs the data plane meanwhile), and its next submission, whatever it is, closes round
k. Ranks count alike because every submission is a collective; a join breaks that, which is why it seals. A rank that submitted a join posts SLOW for ever (it is
*sealed*), and then nobody posts FAST again in this process set.

**Reuse.** Each rank has two buffers (record key and slot), for even and odd rounds. A buffer is reused only
after every peer that read it has said it is done (each rank publishes the last round it resolved); until then
the owner posts SLOW rather than wait, because a reader may be waiting, through the coordinator, for the op
this rank is about to submit. In a loop of blocking calls a peer resolves round k before it posts round k + 1,
so the buffer of round k is always free again at round k + 2.

**Direct rounds.** A broadcast or allgather from DIRECT_FROM bytes (per rank), an allreduce or reducescatter
too large for the slots, and an allreduce from DIRECT_ALLREDUCE_FROM where every rank has a core, need not pass
through the slots: where every rank may copy to and from its peers' memory
(``process_vm_readv``/``writev``, agreed when the shm plane started, :mod:`horovod.backends.cma`), the record
carries the address of the rank's own array instead, and a matched round copies each byte once, straight from the
sender's array into the receiver's, with no size limit. A direct allreduce also posts its output's address: each rank reads its own segment of every peer's
input, reduces it in rank order and writes the result into every peer's output, so no rank waits for another in
the middle of the round (a segment of an input is read only by the rank that reduces it, so even an allreduce in
place is safe). A direct reducescatter is that first half alone. Since peers copy to and from those arrays until
they are done, a direct round ends when every rank has resolved it: each rank publishes that it has, then waits
for the others (the buffer rule above then always holds).

**Split rounds.** An allreduce through the slots at three ranks and more, from SPLIT_FROM bytes, is reduced in two
halves: each rank reduces its segment (upstream's split of the elements) of every slot, in rank order, into its
output and into the same segment of its own slot, which no peer reads in the first half, publishes REDUCED, waits
for every peer's, and copies the peers' segments from their slots. Each rank reads the slots' bytes once instead
of once per rank; the bits are the whole slots' reduction's.

**Grouped rounds.** A blocking grouped allreduce (``hvd.grouped_allreduce``, TensorFlow's and Keras's gradient
allreduces) is one submission, so one record: its members go into the slot one after another (each from a
GROUP_ALIGN boundary), its key is a digest of the members' own keys (:func:`group_key_of`), and a matched round
reduces each member's part of every slot into the member's output. Ranks whose groups differ in any member do not
match, and send the group to the coordinator as they would have.

**Waiting** polls, then sleeps on the set's doorbell (a futex, :mod:`horovod.backends.doorbell`), rung by every
post; a sleeping rank raises its SLEEPING word, and a post makes the futex wake call only when some rank has. A
waiter wakes at least every ``SLICE_SECONDS`` to see whether the engine stopped (an abort, a shutdown, a lost
peer: the call then fails with the engine's reason, as a handle would), and after ``PARK_AFTER_SECONDS`` tells the coordinator which tensor it waits on, so that the stall
inspector reports a rank that never comes exactly as it does for ops that went through the coordinator.

Memory order: every word is written by its owner only, data before key before round before count, and read in
the opposite order; x86-64 keeps stores in order and loads in order, which is all this needs, but for one
store-then-load pair: a ring's bump before it reads the SLEEPING words, which a full barrier separates (see
:meth:`FastRounds.ring`). Other architectures take the coordinator path (:func:`supported`).
"""
from __future__ import annotations

import hashlib
import os
import platform
import threading
import time
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple, TypeVar

import numpy as np

from horovod.backends import cma, doorbell, spin
from horovod.backends.blocks import offsets, split_counts
from horovod.backends.reduce import in_order, reduce_pieces, scaled_copy
from horovod.backends.shm import DIRECT_PIECE_BYTES, FAST_HEADER_BYTES, FAST_LINE_BYTES, FAST_SLOT_BYTES
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import ReduceOp, RequestType, numpy_dtype
from horovod.core.controller.messages import Request
from horovod.core.engine.entry import Entry
from horovod.core.engine.executors import allocate_output
from horovod.core.engine.layouts import row as row_elements
from horovod.core.engine.layouts import split_rows, summed
from horovod.core.engine.state import EngineState

SLICE_SECONDS = 0.05
# Where a set's ranks outnumber the cores, a wait yields its core between polls this long before it sleeps on
# the doorbell: 4 ranks on 2 cores, 4 KB allreduce 121 -> 70 us (docs/benchmarks.md, issue 31).
YIELD_SECONDS = 200e-6
PARK_AFTER_SECONDS = 0.5
# Header words (uint64) of each rank: FAST_ROUND, KEY_LENGTH, ADDRESS and OUT_ADDRESS (a direct allreduce's
# output) have one word per buffer (even and odd rounds); SLEEPING is 1 while the rank sleeps on the doorbell;
# REDUCED is the last split round whose segment the rank has reduced into its slot. The buffers' keys follow
# from KEY_OFFSET, KEY_ROOM bytes each.
COUNT, SEALED, RESOLVED, FAST_ROUND, KEY_LENGTH, ADDRESS, SLEEPING, OUT_ADDRESS, REDUCED = 0, 1, 2, 3, 5, 7, 9, 10, 12
KEY_OFFSET = 104
KEY_ROOM = (FAST_HEADER_BYTES - KEY_OFFSET) // 2
_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})
_TYPES = frozenset({RequestType.ALLREDUCE, RequestType.BROADCAST, RequestType.ALLGATHER, RequestType.REDUCESCATTER})
_REDUCING = frozenset({RequestType.ALLREDUCE, RequestType.REDUCESCATTER})
# The members as module globals: a comparison with one costs a fifth of the enum class's attribute lookup.
_ALLREDUCE, _BROADCAST = RequestType.ALLREDUCE, RequestType.BROADCAST
_REDUCESCATTER = RequestType.REDUCESCATTER
REDUCE_TOTAL_BYTES = 2 << 20    # a fast allreduce's bytes times the ranks: each rank reads them all
# From these sizes (a broadcast's buffer, an allgather's input per rank) the op copies once by cross-memory reads
# and writes where the ranks may use them (a *direct* round), at any size: at 64-256 MB as fast as the data plane's
# chunks on a quiet machine, 3x faster beside busy cores, where each of the chunks' barriers waits for a peer to be
# scheduled. Below them the two copies through a slot are as fast (cache-hot, no system call; docs/benchmarks.md,
# issue 31): a 2-rank broadcast through the slots took 0.71-0.77x the direct round's time at 128 KB, 0.86-0.90x at
# 192 KB, 0.96-1.11x at 256 KB (three A/B runs, seventeenth session; it went direct from 128 KB before). An
# allgather's slot round copies three times (in, then every slot out) against the direct round's twice (its own
# block, the peers' read): at 2 ranks direct took 1.15x the slots' time at 32 KB per rank, 0.99-1.01x at 64 KB,
# 0.87-0.88x at 96 KB, 0.79x at 128 KB, 0.67-0.69x at 256-384 KB (two A/B runs, eighteenth session; it went
# direct from 512 KB before).
DIRECT_FROM = {RequestType.BROADCAST: 256 << 10, RequestType.ALLGATHER: 96 << 10}
# An allreduce or reducescatter goes direct where the slots cannot take it (beyond REDUCE_TOTAL_BYTES read per
# rank, or a slot), at any size: single copies by cross-memory calls move about a quarter of memcpy's bytes per
# second on the reference VM, so below that the slots' two cache-hot copies are mostly faster; above, a direct
# round in pieces of DIRECT_PIECE_BYTES (read, reduced and written while in the cache) beat the data plane's chunks
# by 1.2-1.4x at 64-256 MB (docs/benchmarks.md, issue 31).
# Where every rank has a core, an allreduce goes direct from this size too (per rank, at any rank count): it moves
# half the bytes of the slots' round (each rank reads and writes only its segment of the peers' buffers). 2 ranks,
# 512 KB-1 MB, alternated in one job: 0.84-0.96x the slots' time on a quiet VM, 0.83-1.29x beside two busy cores
# (docs/benchmarks.md, issue 31). Below it the cross-memory calls' fixed cost loses (256 KB: 1.14x, 128 KB: 1.57x).
# So does a reducescatter, the first half of that round: 2 ranks, direct / slots 0.90-0.92x at 512 KB, 0.79-0.81x
# at 768 KB-1 MB; 1.02-1.05x at 384 KB, 1.20-1.62x at 64-256 KB (two A/B runs, eighteenth session).
DIRECT_ALLREDUCE_FROM = 512 << 10
DIRECT_MARK = b"|direct"        # ends a direct round's key
# From this size (per rank), at three ranks and more, an allreduce through the slots is *split*: each rank reduces
# only its segment of every slot (into its output, and publishes it in its own slot's segment, which no peer
# reads in the round's first half), then copies the peers' reduced segments: each rank reads the slots' bytes
# once instead of ``size`` times, the machine reduces every byte once instead of once per rank, for a second wait
# (docs/benchmarks.md, issue 31).
# 3 and 4 ranks on 2 cores, split / whole slots (benchmarks/fast_round_ab.py): 64 KB 1.04-1.20, 128 KB 0.93-1.15,
# 256 KB 0.86-0.93, 512 KB 0.80-0.92.
SPLIT_FROM = 256 << 10
SPLIT_MARK = b"|split"          # ends a split round's key
# A grouped allreduce's key starts so (a single op's starts with its request type's number), and each member's
# part of a slot starts on a boundary of GROUP_ALIGN bytes (a cache line: numpy's kernels run at full speed there).
GROUP_MARK = b"group|"
GROUP_ALIGN = 64
KEYS_KEPT = 1024                # tensor names whose keys (and reducescatter layouts) a rank keeps for the next round
_FENCE = threading.Lock()       # acquired and released by ring(): a full memory barrier (locked instructions)
T = TypeVar("T")


class Parking(Protocol):
    """What a round waiting for its peers needs of the engine (``engine.Engine`` is one)."""

    state: EngineState                      # the waiter gives up once it is STOPPED ...
    error: Optional[HorovodInternalError]   # ... with the reason the engine stopped for
    spin_s: float                           # how long to poll before sleeping (HOROVOD_SPIN_MICROSECONDS)

    def park(self, entry: Entry, since: float) -> None:
        """Tell the coordinator that this rank has waited on ``entry``'s round since ``since`` (monotonic)."""

    def unpark(self, entry: Entry) -> None:
        """The round that :meth:`park` reported has closed."""


def supported() -> bool:
    """Fast rounds need a futex and x86-64's ordering of plain stores and loads."""
    return doorbell.available() and platform.machine() == "x86_64"


def _keep(cache: dict, key: object, value: T) -> T:
    """Store ``value`` under ``key`` in one of a rank's caches (keys, reducescatter layouts, slot views), which
    starts over once it holds KEYS_KEPT entries (a program that makes a new name every step keeps no more)."""
    if len(cache) >= KEYS_KEPT:
        cache.clear()
    cache[key] = value
    return value


def goes_direct(rtype: int, nbytes: int, size: int, cross: bool, roomy: bool) -> bool:
    """Whether a fast round of ``rtype`` on ``nbytes`` per rank moves its data by cross-memory copies (``cross``:
    every rank of the set may read and write the others' memory) instead of through the slots. Where the set's
    ranks outnumber the cores (not ``roomy``), a broadcast or an allgather goes direct only when it does not fit a
    slot: there the direct round's closing wait costs more context switches than the second copy. An allreduce
    beyond REDUCE_TOTAL_BYTES goes direct either way: its slot round would have every rank reduce every slot (4
    ranks on 2 cores, 1 MB: 617-682 us direct against 1021-1089 through the coordinator) unless it can be split
    (:func:`splits`: 0.78-0.85x the direct round's time at 3 and 4 ranks on 2 cores, 768 KB and 1 MB); where every
    rank has a core, one from DIRECT_ALLREDUCE_FROM goes direct too, and so does a reducescatter (beyond a slot it
    goes direct at any rank count). The choice is part of the round's key, so ranks that choose differently do
    not match."""
    if not cross:
        return False
    if rtype == RequestType.ALLREDUCE:
        if roomy and nbytes >= DIRECT_ALLREDUCE_FROM:
            return True
        return nbytes * size > REDUCE_TOTAL_BYTES and not splits(rtype, nbytes, size, False)
    if rtype == RequestType.REDUCESCATTER:
        return (roomy and nbytes >= DIRECT_ALLREDUCE_FROM) or nbytes > FAST_SLOT_BYTES
    return nbytes >= DIRECT_FROM.get(rtype, 1 << 62) and (roomy or nbytes > FAST_SLOT_BYTES)


def splits(rtype: int, nbytes: int, size: int, direct: bool) -> bool:
    """Whether a fast allreduce through the slots of ``nbytes`` per rank is split (see SPLIT_FROM): at three
    ranks and more, from SPLIT_FROM to a slot's size, whatever the ranks' bytes together (each rank reads only
    its own). The choice is part of the round's key."""
    return (rtype == RequestType.ALLREDUCE and not direct and size >= 3
            and SPLIT_FROM <= nbytes <= FAST_SLOT_BYTES)


def key_of(request: Request, nbytes: int, ranks: Sequence[int] = (0, 1), direct: bool = False) -> Optional[bytes]:
    """What must be equal on every rank for a matched round, or None when the op cannot go fast: an allreduce,
    a reducescatter, a broadcast, or an allgather (whose key holds the whole shape: ranks whose first dimensions
    differ do not match, and go through the coordinator) of one host tensor that fits a slot, or (``direct``,
    see :func:`goes_direct`) larger. Every rank of an allreduce through the whole slots reduces all ``size``
    slots itself, so it goes that way only while that stays under REDUCE_TOTAL_BYTES; beyond, a split round
    (:func:`splits`), a direct round or the data plane splits that work. A broadcast whose root is not among the
    set's ``ranks`` (global ranks) goes through the coordinator, which reports it."""
    rtype, size = request.rtype, len(ranks)
    if rtype not in _TYPES or request.group or request.device:
        return None
    if nbytes > FAST_SLOT_BYTES and not direct:
        return None
    if rtype in _REDUCING and request.reduce_op not in _OPS:     # ints: an IntEnum hashes as its value
        return None
    split = splits(rtype, nbytes, size, direct)
    if rtype == RequestType.ALLREDUCE and nbytes * size > REDUCE_TOTAL_BYTES and not direct and not split:
        return None
    if rtype == RequestType.BROADCAST and request.root not in ranks:
        return None
    key = _described(request)
    if direct:
        key += DIRECT_MARK
    elif split:
        key += SPLIT_MARK
    return key if len(key) <= KEY_ROOM else None


def _described(request: Request) -> bytes:
    """What a round's key says of one op: its type, name, dtype, shape, reduction, scale factors and root."""
    # make_request gave the fields their wire types (ints, a list, floats), so they format as they are
    return (f"{request.rtype}|{request.name}|{request.dtype}|{request.shape}|{request.reduce_op}|"
            f"{request.prescale!r}|{request.postscale!r}|{request.root}").encode()


def group_offsets(sizes: Sequence[int]) -> List[int]:
    """Where each member of a grouped round starts in a slot (bytes), each on a GROUP_ALIGN boundary; the last
    element is where the group ends."""
    starts, at = [], 0
    for nbytes in sizes:
        starts.append(at)
        at += group_room(nbytes)
    starts.append(at)
    return starts


def group_room(nbytes: int) -> int:
    """The bytes a member of ``nbytes`` takes in a grouped round's slot: up to the next GROUP_ALIGN boundary."""
    return -(-nbytes // GROUP_ALIGN) * GROUP_ALIGN


def group_capacity(size: int) -> int:
    """The most bytes a grouped round's members may take together (see :func:`group_offsets`) at ``size``
    ranks: a slot, and REDUCE_TOTAL_BYTES read per rank."""
    return min(FAST_SLOT_BYTES, REDUCE_TOTAL_BYTES // size)


def group_key_of(requests: Sequence[Request], sizes: Sequence[int], ranks: Sequence[int] = (0, 1)) -> Optional[bytes]:
    """The key of a grouped round for a blocking grouped allreduce of host tensors (``sizes``: each member's
    bytes), or None when it cannot go fast: every member an allreduce of a reduction a fast round knows, the
    members together within a slot and, since every rank reduces every slot, within REDUCE_TOTAL_BYTES times the
    ranks. The key is GROUP_MARK, the members' count and bytes, and a digest of every member's description: ranks
    whose groups differ in any member, or in their order, do not match."""
    total = group_offsets(sizes)[-1]
    if not requests or total > group_capacity(len(ranks)):
        return None
    digest = hashlib.blake2b(digest_size=20)
    for request in requests:
        if request.rtype != _ALLREDUCE or request.device or request.reduce_op not in _OPS:
            return None
        digest.update(_described(request))
        digest.update(b"\n")
    return GROUP_MARK + f"{len(requests)}|{total}|".encode() + digest.hexdigest().encode()


class FastRounds:
    """This rank's side of the fast rounds of one process set whose ranks all share this host."""

    def __init__(self, area: np.ndarray, rank: int, size: int, ranks: Optional[List[int]] = None,
                 pids: Optional[List[int]] = None) -> None:
        self.rank, self.size = rank, size
        self.pids = pids                # per position, where every rank may copy to and from every other's memory
        self.ranks = list(ranks) if ranks is not None else list(range(size))   # position -> global rank
        self.bell = doorbell.Doorbell(area[:4].view(np.uint32))
        stride = FAST_HEADER_BYTES + 2 * FAST_SLOT_BYTES
        bases = [FAST_LINE_BYTES + r * stride for r in range(size)]
        self.headers = [area[b:b + FAST_HEADER_BYTES] for b in bases]
        self.header_bytes = [memoryview(h) for h in self.headers]     # keys go in and out as bytes
        # Read and written as Python ints through memoryviews: a fraction of numpy's per-element cost, which
        # a small round pays a few dozen times.
        self.words = [memoryview(h[:KEY_OFFSET]).cast("Q") for h in self.headers]
        self._peer_words = [w for r, w in enumerate(self.words) if r != rank]     # what a ring looks at
        starts = [[b + FAST_HEADER_BYTES + i * FAST_SLOT_BYTES for i in range(2)] for b in bases]
        self.slots = [[area[s:s + FAST_SLOT_BYTES] for s in pair] for pair in starts]
        self.peers = [r for r in range(size) if r != rank]
        self.count = 0                  # records this rank posted
        # Per buffer (even and odd rounds): the round of this rank's last FAST record there, and the peers that
        # read it (and its slot) until they resolve that round.
        self.last_fast = [0, 0]
        self.readers: List[List[int]] = [[], []]
        self.off = False                # a rank joined: nobody posts FAST any more
        self.roomy = size <= spin.cores()     # every rank may have a core: spin before sleeping, copy direct
        self.matched = 0                # rounds that ran fast here (tests and benchmarks read it)
        self.direct = 0                 # of which by cross-memory copies
        self.split = 0                  # of which split allreduces (see SPLIT_FROM)
        # The open direct round's contiguous array whose address this rank posted (peers read or write it until
        # they resolve the round), and a direct allreduce's posted output (peers write into it).
        self._posted_array: Optional[np.ndarray] = None
        self._posted_output: Optional[np.ndarray] = None
        self._scratch = np.empty(0, np.uint8)       # peers' segments of a direct allreduce or reducescatter
        # The last key made for each tensor name, with what it was made from (the request, its size, roomy): a
        # training loop repeats the same collectives, and a key costs more to format than to look up.
        self._keys: Dict[str, Tuple[Request, int, bool, Optional[bytes]]] = {}
        self._header_keys: List[Optional[bytes]] = [None, None]     # the key in this rank's header, per buffer
        self._views: Dict[tuple, List[np.ndarray]] = {}    # see _slot_views (views of the shared area: close drops them)
        # Per (round key, buffer), what a round makes of the shared area once and keeps (close drops them too):
        # this rank's slot shaped as its input (_copy_in), a broadcast's root slot shaped as the tensor
        # (_copy_root), an allgather's output shape and every slot shaped as its rows (_gather), the reduction of
        # every slot (_reduce_slots)
        self._inputs: Dict[Tuple[bytes, int], Tuple[tuple, Optional[np.ndarray], float]] = {}
        self._roots: Dict[Tuple[bytes, int], Tuple[tuple, Optional[np.ndarray]]] = {}
        self._gathers: Dict[Tuple[bytes, int], Tuple[tuple, np.dtype, List[Tuple[slice, np.ndarray]]]] = {}
        self._reductions: Dict[Tuple[bytes, int], Tuple[tuple, Callable[[np.ndarray], None]]] = {}
        self._splits: Dict[Tuple[bytes, int], Tuple[tuple, np.dtype, _Split]] = {}    # see _finish_split
        self._rows: Dict[Tuple[int, ...], Tuple[int, Tuple[int, ...]]] = {}   # a reducescatter's own rows
        # Per group name, the last grouped round's key with what it was made from (see group_key), and per
        # (round key, buffer) what a grouped round makes of the slots once (see _Group)
        self._group_keys: Dict[str, Tuple[Tuple[Request, ...], Tuple[int, ...], Optional[bytes]]] = {}
        self._groups: Dict[Tuple[bytes, int], _Group] = {}

    def close(self) -> None:
        """Let go of the shared area (the engine stopped and no round is open), so that the segment can unmap."""
        self.off = True
        self.bell = None
        self.headers, self.header_bytes, self.words, self.slots, self._peer_words = [], [], [], [], []
        self._views.clear()
        self._inputs.clear()
        self._roots.clear()
        self._gathers.clear()
        self._reductions.clear()
        self._splits.clear()
        self._groups.clear()

    def ring(self) -> None:
        """Wake the peers waiting on a round (a no-op once closed). The futex wake, most of a ring's cost, is made
        only when a rank sleeps: a polling one sees the post anyway. The bump is made visible before the
        SLEEPING words are read (a lock round trip is a full barrier on x86-64), and a sleeper sets its word
        before the kernel reads the bell (the futex call takes a lock first): so either the sleeper's kernel sees
        the bump and does not sleep, or this ring sees the sleeper and wakes it."""
        bell = self.bell
        if bell is None:
            return
        bell.bump()
        with _FENCE:
            pass
        for w in self._peer_words:
            if w[SLEEPING]:
                bell.wake()
                return

    def key(self, request: Request, nbytes: int) -> Optional[bytes]:
        """The round's key for ``request`` on this set (:func:`key_of`), or None when it cannot go fast."""
        made = self._keys.get(request.name)
        if made is not None and made[1] == nbytes and made[2] == self.roomy and (made[0] is request
                                                                             or made[0] == request):
            return made[3]
        direct = goes_direct(request.rtype, nbytes, self.size, self.pids is not None, self.roomy)
        key = key_of(request, nbytes, self.ranks, direct)
        _keep(self._keys, request.name, (request, nbytes, self.roomy, key))
        return key

    def group_key(self, entries: Sequence[Entry]) -> Optional[bytes]:
        """The grouped round's key for a blocking grouped allreduce's ``entries`` on this set
        (:func:`group_key_of`, kept per group name), or None when it cannot go fast."""
        requests = tuple(e.request for e in entries)
        sizes = tuple(e.tensor.nbytes for e in entries)
        name = requests[0].group
        made = self._group_keys.get(name)
        if made is not None and made[1] == sizes and made[0] == requests:
            return made[2]
        key = group_key_of(requests, sizes, self.ranks)
        _keep(self._group_keys, name, (requests, sizes, key))
        return key

    def forget_keys(self) -> None:
        """Drop the keys kept per tensor name, so that the next rounds choose their path afresh (a benchmark that
        changes this module's thresholds mid-run, benchmarks/fast_round_ab.py)."""
        self._keys.clear()
        self._group_keys.clear()

    # ------------------------------------------------------------------ posting (engine lock held)
    def can_post_fast(self) -> bool:
        """Whether this rank may post a FAST record now: no rank joined, and the buffer the next round would use
        is no longer read by anyone. (Never wait for those readers instead: they may be waiting, through the
        coordinator, for the very op this rank is about to submit.)"""
        if self.off:
            return False
        words = self.words
        for p in self.peers:
            if words[p][SEALED]:
                self.off = True
                return False
        b = (self.count + 1) % 2
        last = self.last_fast[b]
        for p in self.readers[b]:
            if words[p][RESOLVED] < last:
                return False
        return True

    def post_fast(self, entry: Entry, key: bytes) -> int:
        """Post this rank's next record as FAST for ``entry``: its input goes into the round's slot; returns the
        round."""
        k = self.count + 1
        b = k % 2
        request = entry.request
        mine = self.words[self.rank]
        if key.endswith(DIRECT_MARK):
            self._posted_array = posted = self._direct_array(entry)
            mine[ADDRESS + b] = at = cma.shared_address(posted)
            if request.rtype == _ALLREDUCE:
                out = entry.output
                self._posted_output = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
                mine[OUT_ADDRESS + b] = cma.shared_address(self._posted_output, besides=at)
        else:
            self._copy_in(entry, key, b)
        return self._post_key(key, k)

    def post_fast_group(self, entries: Sequence[Entry], key: bytes) -> int:
        """Post this rank's next record as FAST for a grouped allreduce's ``entries`` (one submission): each
        member's input, prescaled, into its part of the round's slot; returns the round."""
        k = self.count + 1
        group = self._group(key, k % 2, entries)
        for entry, view, prescale in zip(entries, group.inputs, group.prescales):
            scaled_copy(view, entry.tensor, prescale)
        return self._post_key(key, k)

    def _post_key(self, key: bytes, k: int) -> int:
        """Publish round ``k``'s key and the record (the data is in place): the last steps of a FAST post."""
        b = k % 2
        mine = self.words[self.rank]
        if key is not self._header_keys[b]:         # a repeated op's key (the same object) is there already
            at = KEY_OFFSET + b * KEY_ROOM
            self.header_bytes[self.rank][at:at + len(key)] = key
            mine[KEY_LENGTH + b] = len(key)
            self._header_keys[b] = key
        mine[FAST_ROUND + b] = k
        mine[COUNT] = self.count = k
        self.last_fast[b] = k
        return k

    def _group(self, key: bytes, b: int, entries: Sequence[Entry]) -> _Group:
        """What a grouped round of ``key`` makes of slot ``b`` (made once per key and buffer, and kept)."""
        group = self._groups.get((key, b))
        if group is None:
            group = _keep(self._groups, (key, b), _Group(self, b, entries))
        return group

    def _copy_in(self, entry: Entry, key: bytes, b: int) -> None:
        """This rank's input, prescaled, into its slot ``b`` (a broadcast's other ranks send nothing), through a
        view of the slot shaped as the input: made once per round key and buffer, and kept."""
        tensor = entry.tensor
        made = self._inputs.get((key, b))
        if made is None or made[0] != tensor.shape:
            request = entry.request
            view = None
            if request.rtype != _BROADCAST or self.ranks.index(request.root) == self.rank:
                view = self._slot_views(b, 0, tensor.nbytes, tensor.dtype)[self.rank].reshape(tensor.shape)
            made = _keep(self._inputs, (key, b), (tensor.shape, view, float(request.prescale)))
        if made[1] is not None:
            if made[2] == 1.0:
                np.copyto(made[1], tensor)
            else:
                scaled_copy(made[1], tensor, made[2])

    def post_slow(self, seal: bool = False) -> None:
        """Post this rank's next record as SLOW; ``seal`` (a join) makes every later one SLOW too."""
        mine = self.words[self.rank]
        if seal:
            mine[SEALED] = 1
            self.off = True
        self.count += 1
        mine[COUNT] = self.count

    # ------------------------------------------------------------------ a round
    def resolve(self, k: int, key: bytes, entry: Entry, engine: Parking,
                members: Optional[Sequence[Entry]] = None) -> bool:
        """Wait for every peer's k-th record; when all match, reduce into ``entry.output`` (a grouped round:
        into each of ``members``' outputs; ``entry`` is the first) and return True.

        False: the round did not match, and the op must go to the coordinator. Raises HorovodInternalError when
        the engine stops meanwhile, or when a direct round's cross-memory copy fails.
        """
        posted, self._posted_array = self._posted_array, None
        posted_output, self._posted_output = self._posted_output, None
        words, headers = self.words, self.header_bytes
        for p in self.peers:                    # most often every peer has posted already: no wait to set up
            if words[p][COUNT] < k and not words[p][SEALED]:
                self._wait(lambda p: self._posted(p, k), entry, engine)
                break
        b = k % 2
        at = KEY_OFFSET + b * KEY_ROOM
        length = len(key)
        end, posted_round, posted_length = at + length, FAST_ROUND + b, KEY_LENGTH + b
        # One pass over the peers (a round's most repeated step): each peer's count, then its record's round,
        # then its key, the order in which their owner wrote them last.
        fast: List[int] = []
        matched = True
        for p in self.peers:
            w = words[p]
            if w[COUNT] >= k and w[posted_round] == k:
                fast.append(p)
                if matched and (w[posted_length] != length or headers[p][at:end] != key):
                    matched = False
            else:
                matched = False
        self.readers[b] = fast
        if not matched:
            words[self.rank][RESOLVED] = k
            return False
        if members is not None:
            self._groups[(key, b)].finish(members)
            words[self.rank][RESOLVED] = k
        elif posted is None:
            if key.endswith(SPLIT_MARK):
                self._finish_split(entry, b, key, k, engine)
                self.split += 1
            else:
                self._finish(entry, b, key)
            words[self.rank][RESOLVED] = k
        else:
            try:
                self._finish_direct(entry, b, posted, posted_output)
            finally:
                # Peers copy to and from ``posted`` until they resolve the round: wait for them all.
                words[self.rank][RESOLVED] = k
                self.ring()
                self._wait(lambda p: words[p][RESOLVED] >= k, entry, engine)
            self._after_direct(entry, posted, posted_output)
            self.direct += 1
        self.matched += 1
        return True

    def _posted(self, peer: int, k: int) -> bool:
        words = self.words[peer]
        return bool(words[COUNT] >= k or words[SEALED])

    def _wait(self, ready: Callable[[int], bool], entry: Entry, engine: Parking) -> None:
        """Until ``ready(peer)`` holds for every peer: polled (yielding the core before each poll where the
        ranks outnumber the cores), then asleep on the doorbell, which every post rings."""
        missing = [p for p in self.peers if not ready(p)]
        if not missing:
            return
        # Poll first, as the engine thread does after activity (HOROVOD_SPIN_MICROSECONDS): a peer that posts
        # within the spin costs neither a futex sleep here nor a wake-up there (half a small op's time). Where
        # the set's ranks outnumber the cores a plain spin would take the core a peer needs: there each poll
        # yields the core first (Open MPI's yield_when_idle), so a peer waiting for it runs at once instead of
        # after a futex wake-up.
        now = time.perf_counter()
        if self.roomy:
            spin_until = now + engine.spin_s
            while time.perf_counter() < spin_until:
                missing = [p for p in missing if not ready(p)]
                if not missing:
                    return
        else:
            yield_until = now + YIELD_SECONDS
            while time.perf_counter() < yield_until:
                os.sched_yield()
                missing = [p for p in missing if not ready(p)]
                if not missing:
                    return
        bell, started, parked = self.bell, time.monotonic(), False
        mine = self.words[self.rank]
        try:
            while True:
                seen = bell.value()
                missing = [p for p in missing if not ready(p)]
                if not missing:
                    return
                if engine.state is EngineState.STOPPED:   # with the reason an aborting engine found, as handles
                    raise HorovodInternalError(str(engine.error))
                mine[SLEEPING] = 1                  # before the kernel reads the bell (see ring)
                bell.sleep(seen, SLICE_SECONDS)
                if not parked and time.monotonic() - started > PARK_AFTER_SECONDS:
                    parked = True
                    engine.park(entry, started)
        finally:
            mine[SLEEPING] = 0
            if parked:
                engine.unpark(entry)

    # ------------------------------------------------------------------ direct rounds
    def _direct_array(self, entry: Entry) -> np.ndarray:
        """The C-contiguous array a direct round posts: the input that the peers read (a broadcast's root, every
        rank of an allgather, an allreduce or a reducescatter), or the output that the root writes to and this
        rank reads into (a broadcast's other ranks; a scratch array where the output is not contiguous)."""
        request = entry.request
        if request.rtype == _BROADCAST and self.ranks.index(request.root) != self.rank:
            out = entry.output
            return out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        return np.ascontiguousarray(entry.tensor)

    def _finish_direct(self, entry: Entry, b: int, posted: np.ndarray,
                       posted_output: Optional[np.ndarray]) -> None:
        """A matched direct round's copies, straight between the ranks' own arrays (one copy per byte).

        An allreduce or reducescatter: see :meth:`_reduce_direct`.

        A broadcast splits the work as the data plane does: the root writes the first 1/size of the buffer (whole
        pages) into every peer, each peer reads the rest from the root. An allgather reads each peer's block from
        the peer's input, starting with the next rank's, so that no two readers start on the same block. The
        caller then waits until every peer has resolved the round, so that nothing is copied after it returns.
        """
        request = entry.request
        addresses = [int(w[ADDRESS + b]) for w in self.words]
        if request.rtype in _REDUCING:
            self._reduce_direct(entry, b, posted, posted_output, addresses)
            return
        if request.rtype == _BROADCAST:
            root = self.ranks.index(request.root)
            raw = posted.reshape(-1).view(np.uint8)
            head = cma.root_share(raw.nbytes, self.size)
            if self.rank != root:
                self._cross(root, cma.read, addresses[root] + head, raw[head:], entry)
                return
            if head:
                for p in self.peers:
                    self._cross(p, cma.write, addresses[p], raw[:head], entry)
            _root_output(entry)
            return
        out = self._gathered_output(entry, posted.dtype)
        flat = out.reshape(-1) if out.flags.c_contiguous else np.empty(out.size, out.dtype)
        count = posted.size
        flat[self.rank * count:(self.rank + 1) * count] = posted.reshape(-1)
        for step in range(1, self.size):
            r = (self.rank + step) % self.size
            self._cross(r, cma.read, addresses[r], flat[r * count:(r + 1) * count], entry)
        if not out.flags.c_contiguous:
            np.copyto(out, flat.reshape(out.shape))
        entry.output = out

    def _reduce_direct(self, entry: Entry, b: int, posted: np.ndarray, posted_output: Optional[np.ndarray],
                       addresses: List[int]) -> None:
        """A direct allreduce or reducescatter: this rank's segment of every peer's input (``posted`` on each
        rank), read straight from the peer's memory and reduced in rank order with this rank's own, as the data
        plane reduces (the same bits). The segment is this rank's rows of a reducescatter (upstream's split), its
        1/size of an allreduce, whose reduced segment this rank then writes into every peer's posted output, as
        each peer writes its segment into this rank's: once every rank has resolved the round, every output is
        whole. Only this rank reads its segment of any input, so it is still intact when read, in place or not.

        The segment goes in pieces of DIRECT_PIECE_BYTES: each piece is read from every peer, reduced and (an
        allreduce) written to every peer while it is still in the cache, and the scratch space stays ``size``
        pieces whatever the tensor's size."""
        request = entry.request
        flat_in = posted.reshape(-1)
        dtype, itemsize = flat_in.dtype, flat_in.dtype.itemsize
        if request.rtype == _REDUCESCATTER:
            lo, out = self._own_rows(entry, dtype)
            segment = out.reshape(-1)
            count = segment.size
        else:
            counts = split_counts(flat_in.size, self.size)
            lo, count = sum(counts[:self.rank]), counts[self.rank]
            out = posted_output
            segment = out.reshape(-1)[lo:lo + count]
        outputs = [int(w[OUT_ADDRESS + b]) for w in self.words] if request.rtype == _ALLREDUCE else None

        def read(r: int, start: int, part: np.ndarray) -> None:
            self._cross(r, cma.read, addresses[r] + (lo + start) * itemsize, part, entry)

        def write(r: int, start: int, reduced: np.ndarray) -> None:
            self._cross(r, cma.write, outputs[r] + (lo + start) * itemsize, reduced, entry)

        op, postscale = summed(request.reduce_op, float(request.postscale), self.size)
        reduce_pieces(self.rank, self.size, flat_in[lo:lo + count], segment, op, float(request.prescale), postscale,
                      max(1, DIRECT_PIECE_BYTES // itemsize), lambda i, n: self._scratch_part(i, n, dtype), read,
                      write if outputs is not None else None)
        if request.rtype == _REDUCESCATTER:
            entry.output = out

    def _scratch_part(self, index: int, count: int, dtype: np.dtype) -> np.ndarray:
        """The ``index``-th of ``size`` scratch arrays of ``count`` elements (kept between rounds: no page faults
        once warm)."""
        nbytes = count * dtype.itemsize
        if self._scratch.nbytes < self.size * nbytes:
            self._scratch = np.empty(self.size * nbytes, np.uint8)
        return self._scratch[index * nbytes:(index + 1) * nbytes].view(dtype)

    def _after_direct(self, entry: Entry, posted: np.ndarray, posted_output: Optional[np.ndarray]) -> None:
        """Once every peer resolved the round: a broadcast that a rank other than the root received into a scratch
        array (its output is not contiguous) goes to the output, now that the root has written its part too; so
        does an allreduce whose output was not contiguous, now that every peer has written its segment."""
        request, out = entry.request, entry.output
        if posted_output is not None and posted_output is not out:
            np.copyto(out, posted_output)
            return
        if request.rtype == _BROADCAST and posted is not out \
                and self.ranks.index(request.root) != self.rank:
            np.copyto(out, posted)

    def _cross(self, peer: int, copy: Callable[[int, int, np.ndarray], None], address: int,
               array: np.ndarray, entry: Entry) -> None:
        """One cross-memory copy with ``peer`` (a position in the set); a failure names the peer and the tensor."""
        try:
            copy(self.pids[peer], address, array)
        except cma.CrossMemoryError as exc:
            op = RequestType(entry.request.rtype).name.lower()
            raise HorovodInternalError(
                f"The {op} of tensor '{entry.name}' could not copy to or from rank {self.ranks[peer]}'s memory "
                f"({exc}); that rank has probably exited.") from None

    def _finish(self, entry: Entry, b: int, key: bytes) -> None:
        """The matched round's result into ``entry.output`` (an allgather's is allocated here)."""
        request = entry.request
        rtype = request.rtype
        if rtype == _ALLREDUCE:
            self._reduce_slots(key, b, request, entry.output, 0)
        elif rtype == _BROADCAST:
            self._copy_root(entry, b, key)
        elif rtype == _REDUCESCATTER:
            dtype = numpy_dtype(request.dtype)
            start, out = self._own_rows(entry, dtype)
            self._reduce_slots(key, b, request, out, start * dtype.itemsize)
            entry.output = out
        else:
            self._gather(entry, b, key)

    def _finish_split(self, entry: Entry, b: int, key: bytes, k: int, engine: Parking) -> None:
        """A matched split allreduce (see SPLIT_FROM): this rank's segment of every slot ``b`` reduced in rank order
        (the same bits as the whole slots' reduction) into its output, published in its own slot's segment (only
        this rank reads that segment of its slot in the round's first half), then, once every peer has published
        its own, the peers' reduced segments copied into the output. The segments and their views are made once
        per round key and buffer."""
        out = entry.output
        made = self._splits.get((key, b))
        if made is None or made[0] != out.shape or made[1] != out.dtype:
            request = entry.request
            op, postscale = summed(request.reduce_op, float(request.postscale), self.size)
            made = _keep(self._splits, (key, b), (out.shape, out.dtype, _Split(
                self, b, out.size, out.dtype, op, postscale)))
        split = made[2]
        flat = out.reshape(-1) if out.flags.c_contiguous else np.empty(out.size, out.dtype)
        mine = flat[split.own]
        split.reduce(mine)
        np.copyto(split.published, mine)
        words = self.words
        words[self.rank][REDUCED] = k
        self.ring()
        self._wait(lambda p: words[p][REDUCED] >= k, entry, engine)
        for segment, view in split.peers:
            np.copyto(flat[segment], view)
        if not out.flags.c_contiguous:
            out[...] = flat.reshape(out.shape)

    def _copy_root(self, entry: Entry, b: int, key: bytes) -> None:
        """A matched broadcast: the root's slot ``b`` into this rank's output (the root's own: its input), through
        a view of the slot shaped as the tensor, made once per round key and buffer."""
        made = self._roots.get((key, b))
        if made is None:
            request, tensor = entry.request, entry.tensor
            root = self.ranks.index(request.root)
            view = None if root == self.rank else self._slot_views(
                b, 0, tensor.nbytes, numpy_dtype(request.dtype))[root].reshape(tensor.shape)
            made = _keep(self._roots, (key, b), (tensor.shape, view))
        out, view = entry.output, made[1]
        if view is None:
            _root_output(entry)
        elif out.shape == made[0]:
            np.copyto(out, view)
        else:
            np.copyto(out.reshape(-1), view.reshape(-1))

    def _gather(self, entry: Entry, b: int, key: bytes) -> None:
        """A matched allgather: every rank's slot ``b``, in rank order, into a new output (equal shapes: the key
        says so); the output's shape and the slots' views shaped as rows are made once per round key and buffer."""
        made = self._gathers.get((key, b))
        if made is None:
            request = entry.request
            shape, dtype = tuple(request.shape), numpy_dtype(request.dtype)
            rows = shape[0]
            views = self._slot_views(b, 0, entry.tensor.nbytes, dtype)
            made = _keep(self._gathers, (key, b), ((rows * self.size, *shape[1:]), dtype, [
                (slice(r * rows, (r + 1) * rows), view.reshape(shape)) for r, view in enumerate(views)]))
        out = allocate_output(entry, made[0], made[1])
        for rows, view in made[2]:
            out[rows] = view
        entry.output = out

    def _gathered_output(self, entry: Entry, dtype: np.dtype) -> np.ndarray:
        """A new output of ``dtype`` for a matched allgather: every rank's rows (equal shapes: the key says so)."""
        shape = tuple(entry.request.shape)
        return allocate_output(entry, (shape[0] * self.size, *shape[1:]), dtype)

    def _own_rows(self, entry: Entry, dtype: np.dtype) -> Tuple[int, np.ndarray]:
        """Where this rank's rows of a reducescatter (upstream's split) start in the input, in elements, and a
        new output of ``dtype`` for them."""
        shape = tuple(entry.request.shape)
        layout = self._rows.get(shape)
        if layout is None:
            rows = split_rows(shape, self.size)
            layout = _keep(self._rows, shape,
                           (sum(rows[:self.rank]) * row_elements(shape[1:]), (rows[self.rank], *shape[1:])))
        return layout[0], allocate_output(entry, layout[1], dtype)

    def _reduce_slots(self, key: bytes, b: int, request: Request, out: np.ndarray, start: int) -> None:
        """Every rank's slot ``b`` from byte ``start``, as many elements as ``out`` holds, reduced into ``out``
        in rank order (the data plane's order and kernels, so the same bits), then post-scaled: an allreduce's
        whole slots, a reducescatter's rows of this rank. The reduction is made once per round key and buffer
        (the key fixes the op, the scale factors, the dtype and the shape, so the rows too) and kept."""
        made = self._reductions.get((key, b))
        if made is None or made[0] != out.shape:
            op, postscale = summed(request.reduce_op, float(request.postscale), self.size)
            views = [v.reshape(out.shape) for v in self._slot_views(b, start, out.nbytes, out.dtype)]
            made = _keep(self._reductions, (key, b), (out.shape, in_order(views, op, postscale)))
        made[1](out)

    def _slot_views(self, b: int, start: int, nbytes: int, dtype: np.dtype) -> List[np.ndarray]:
        """Every rank's slot ``b`` from byte ``start``, ``nbytes`` of it as ``dtype``, in rank order (kept: a
        training loop asks for the same views every step, and making them costs more than finding them)."""
        at = (b, start, nbytes, dtype)
        views = self._views.get(at)
        if views is None:
            views = _keep(self._views, at, [pair[b][start:start + nbytes].view(dtype) for pair in self.slots])
        return views


class _Split:
    """What a split round (:meth:`FastRounds._finish_split`) of one shape and dtype on one buffer needs: this rank's
    segment (a slice of the flat output), the reduction of that segment of every slot, where the rank publishes
    it (its own slot's segment), and each peer's segment with the view of the peer's slot it is copied from."""

    __slots__ = ("own", "reduce", "published", "peers")

    def __init__(self, rounds: FastRounds, b: int, count: int, dtype: np.dtype, op: ReduceOp,
                 postscale: float) -> None:
        counts = split_counts(count, rounds.size)
        starts = offsets(counts)
        itemsize = np.dtype(dtype).itemsize

        def segment(r: int) -> List[np.ndarray]:
            return rounds._slot_views(b, starts[r] * itemsize, counts[r] * itemsize, dtype)

        me = rounds.rank
        self.own = slice(starts[me], starts[me] + counts[me])
        views = segment(me)
        self.reduce = in_order(views, op, postscale)
        self.published = views[me]
        self.peers = [(slice(starts[p], starts[p] + counts[p]), segment(p)[p]) for p in rounds.peers]


class _Group:
    """What a grouped round (:meth:`FastRounds.post_fast_group`) of one key on one buffer needs: each member's
    part of this rank's slot shaped as its input, its prescale factor, and the reduction of that part of every
    slot (in rank order: the data plane's bits), made for the member's output shape when first used."""

    __slots__ = ("inputs", "prescales", "parts", "ops", "reductions")

    def __init__(self, rounds: FastRounds, b: int, entries: Sequence[Entry]) -> None:
        starts = group_offsets([e.tensor.nbytes for e in entries])
        self.inputs: List[np.ndarray] = []
        self.prescales: List[float] = []
        self.parts: List[List[np.ndarray]] = []          # per member, every rank's part of its slot, flat
        self.ops: List[Tuple[ReduceOp, float]] = []        # per member, the backend op and postscale factor
        self.reductions: List[Optional[Tuple[tuple, Callable[[np.ndarray], None]]]] = []
        for entry, start in zip(entries, starts):
            tensor, request = entry.tensor, entry.request
            views = [pair[b][start:start + tensor.nbytes].view(tensor.dtype) for pair in rounds.slots]
            self.inputs.append(views[rounds.rank].reshape(tensor.shape))
            self.prescales.append(float(request.prescale))
            self.parts.append(views)
            self.ops.append(summed(request.reduce_op, float(request.postscale), rounds.size))
            self.reductions.append(None)

    def finish(self, entries: Sequence[Entry]) -> None:
        """Every member's parts of the slots reduced into its output."""
        reductions = self.reductions
        for i, entry in enumerate(entries):
            out = entry.output
            made = reductions[i]
            if made is None or made[0] != out.shape:
                op, postscale = self.ops[i]
                made = reductions[i] = (out.shape, in_order([v.reshape(out.shape) for v in self.parts[i]], op,
                                                            postscale))
            made[1](out)


def _root_output(entry: Entry) -> None:
    """A broadcast's root into its own output: nothing when that is its input (in place), else a local copy."""
    if not _same_array(entry.output, entry.tensor):
        np.copyto(entry.output, entry.tensor.reshape(entry.output.shape))


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays are the same bytes (a tensor and a view of it given as its own output)."""
    return a is b or (a.flags.c_contiguous and b.flags.c_contiguous and a.nbytes == b.nbytes
                      and cma.address(a) == cma.address(b))
