"""The coordinator's negotiation: which named tensors every rank has submitted, and do they agree.

Rank 0 of the process set runs a :class:`Coordinator`. Workers forward their requests to it; it records them
per tensor name, and once every rank that has not joined has submitted a name, it checks that the submissions
agree and turns them into one :class:`TensorResponse` (or an error that names the tensor, the ranks and the
values that differ). :meth:`Coordinator.take_ready` returns the ready work in a deterministic order, already
planned into fused batches and encoded for the wire.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Dict, List, Optional, Set, Tuple

from horovod.common.timeline import Timeline
from horovod.common.types import DataType, ReduceOp, RequestType, numpy_dtype
from horovod.core.controller import fusion
from horovod.core.controller.messages import HOST, Request, Tag, TensorResponse
from horovod.core.controller.response_cache import ResponseCache

_OP_NAMES = {int(v): v.name for v in RequestType}
_DTYPE_NAMES = {int(v): v.name.lower() for v in DataType}
_REDUCE_NAMES = {int(v): v.name.capitalize() for v in ReduceOp}
# Requests of these types must be identical on every rank (no per-rank fields), which allows a fast check.
_IDENTICAL_TYPES = frozenset({RequestType.ALLREDUCE, RequestType.REDUCESCATTER, RequestType.BARRIER})
_NOT_WITH_JOIN = {
    RequestType.ALLGATHER: "Allgather",
    RequestType.BROADCAST: "Broadcast",
    RequestType.ALLTOALL: "Alltoall",
    RequestType.REDUCESCATTER: "Reducescatter",
}


def _request_bytes(request: Request) -> int:
    n = 1
    for d in request.shape:
        n *= d
    return n * _ITEMSIZE.get(request.dtype, 4)


_ITEMSIZE = {int(t): numpy_dtype(t).itemsize for t in DataType}


def _ranks_text(by_value: Dict) -> str:
    parts = []
    for value, ranks in by_value.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(str(r) for r in ranks)} sent {value}")
    return "; ".join(parts)


def _disagreement(requests: Dict[int, list], key, ranks: List[int]) -> Optional[str]:
    """``None`` if ``key(request)`` is equal on every rank, else 'rank 0 sent X; rank 1 sent Y' (requests are keyed
    by position in the process set; ``ranks`` names those positions by global rank)."""
    by_value: Dict = OrderedDict()
    for position in sorted(requests):
        value = key(requests[position])
        by_value.setdefault(str(value) if isinstance(value, list) else value, []).append(ranks[position])
    return None if len(by_value) == 1 else _ranks_text(by_value)


def carried_inputs(request: Request, inputs: Dict[int, object], size: int, ranks: List[int]) -> Optional[list]:
    """The inputs a carried tensor (core/engine/carried.py) is completed with, once every one it needs came: the
    root's for a broadcast, every rank's in rank order otherwise (``inputs``: by position; ``ranks``: position ->
    global rank); None while one is missing (a joined rank, a rank that did not carry)."""
    if request.rtype == RequestType.BROADCAST:
        root = ranks.index(request.root) if request.root in ranks else -1
        return [inputs[root]] if root in inputs else None
    return [inputs[p] for p in range(size)] if len(inputs) == size else None


class _Pending:
    __slots__ = ("requests", "first_seen", "waiting", "inputs")

    def __init__(self) -> None:
        self.requests: Dict[int, list] = {}
        self.inputs: Optional[Dict[int, object]] = None     # carried inputs by rank (core/engine/carried.py)
        self.first_seen = time.monotonic()
        self.waiting: Optional[Set[int]] = None      # ranks blocked in a wait on this tensor (made on demand)


class Coordinator:
    """Negotiation state of one process set, kept on its rank 0."""

    def __init__(self, size: int, cache: ResponseCache, fusion_threshold: int,
                 disable_group_fusion: bool = False, ranks: Optional[List[int]] = None) -> None:
        self.size = size
        # Ranks are positions in the process set everywhere here; messages name them by global rank.
        self.ranks = list(ranks) if ranks is not None else list(range(size))
        self.cache = cache
        self.fusion_threshold = fusion_threshold
        self.disable_group_fusion = disable_group_fusion
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._ready: OrderedDict[str, float] = OrderedDict()      # name -> when it became ready
        self._ready_bytes = 0
        self._urgent: Set[str] = set()
        self._group_ready: Dict[str, List[str]] = {}
        self._joined: Set[int] = set()
        # Ranks that waited from a program submitting from several threads (see handles.several_threads).
        self.several_threads: Set[int] = set()
        self._last_joined = -1
        self._join_done = False
        self.timeline: Optional[Timeline] = None      # set on the coordinator while a timeline records
        self.progress = 0       # grows with every request taken and every response list emitted
        # Tensors that ranks wait on in a fast round (engine/fast_rounds.py), which the coordinator never sees
        # requested: name -> (first seen, ranks waiting). Only the stall inspector looks at them.
        self._parked: Dict[str, Tuple[float, Set[int]]] = {}

    # ----------------------------------------------------------------- intake
    def add_request(self, rank: int, request: Request, carried: object = None) -> None:
        """Record ``rank``'s request; JOIN marks the rank joined. ``carried``: the input that came with it (a
        small blocking collective, core/engine/carried.py): when every input it needs came, the tensor is
        emitted as one CARRIED item, for rank 0's engine to complete, instead of in a batch for the data plane."""
        self.progress += 1
        if request.rtype == RequestType.JOIN:
            self._joined.add(rank)
            self._last_joined = rank
            for name, entry in self._pending.items():
                self._refresh(name, entry)
            if len(self._joined) == self.size:
                self._join_done = True
            return
        name = request.name
        entry = self._pending.get(name)
        timeline = self.timeline
        if entry is None:
            entry = self._pending[name] = _Pending()
            if timeline is not None:
                timeline.negotiate_start(name, _OP_NAMES[request.rtype])
        entry.requests[rank] = request
        if carried is not None:
            if entry.inputs is None:
                entry.inputs = {rank: carried}
            else:
                entry.inputs[rank] = carried
        if timeline is not None:
            timeline.rank_ready(name, rank)
        self._refresh(name, entry)

    def _refresh(self, name: str, entry: _Pending) -> None:
        if name in self._ready or not entry.requests:
            return
        if len(entry.requests) + len(self._joined.difference(entry.requests)) >= self.size:
            self._ready[name] = time.monotonic()
            first = next(iter(entry.requests.values()))
            self._ready_bytes += _request_bytes(first)
            timeline = self.timeline
            if timeline is not None:
                timeline.negotiate_end(name)
                timeline.begin((name,), _OP_NAMES[first.rtype])
                timeline.begin((name,), "QUEUE")

    def mark_urgent(self, names) -> None:
        """Some rank waits on these tensors: emit them as soon as they are ready (unknown names are ignored,
        so a late notice can never speed up a later tensor of the same name)."""
        for name in names:
            if name in self._pending:
                self._urgent.add(name)

    def mark_waiting(self, rank: int, names, several_threads: bool = False) -> None:
        """``rank`` blocks in a wait on these tensors: emit them at once, and remember who waits (for the
        deadlock detector). A notice for a tensor that ``rank`` has not submitted (a late notice about an
        instance that already completed) records nothing. ``several_threads``: the wait comes from a program that
        submits from several threads (remembered for the rest of the job)."""
        if several_threads:
            self.several_threads.add(rank)
        pending = self._pending
        for name in names:
            entry = pending.get(name)
            if entry is None:
                continue
            self._urgent.add(name)
            if rank in entry.requests:
                if entry.waiting is None:
                    entry.waiting = {rank}
                else:
                    entry.waiting.add(rank)

    def park(self, rank: int, name: str, waited: float) -> None:
        """``rank`` has waited ``waited`` seconds on ``name``'s fast round, which some rank has not joined yet."""
        start = time.monotonic() - waited
        since, ranks = self._parked.get(name, (start, set()))
        ranks.add(rank)
        self._parked[name] = (min(since, start), ranks)

    def unpark(self, rank: int, name: str) -> None:
        """``name``'s fast round closed for ``rank``."""
        parked = self._parked.get(name)
        if parked is not None:
            parked[1].discard(rank)
            if not parked[1]:
                del self._parked[name]

    def unmark_waiting(self, rank: int, names) -> None:
        """``rank`` no longer blocks on these tensors (its timed wait ran out and was not resumed)."""
        pending = self._pending
        for name in names:
            entry = pending.get(name)
            if entry is not None and entry.waiting:
                entry.waiting.discard(rank)

    def waits(self) -> List[Tuple[str, str, List[int], List[int]]]:
        """(name, op type, ranks that submitted, ranks waiting on it) for every pending tensor some rank waits
        on, in submission order."""
        return [(name, _OP_NAMES[next(iter(e.requests.values())).rtype], sorted(e.requests), sorted(e.waiting))
                for name, e in self._pending.items() if e.waiting]

    def emit_due(self, now: float, bucket_bytes: int, hold_s: float) -> Optional[float]:
        """0 when ready work should be emitted now, else seconds until it will be (None: nothing ready).

        Ready work goes at once when a rank waits on any of it, when a bucket's worth of bytes is ready, or
        when the oldest ready tensor has been held for ``hold_s``.
        """
        if self._join_done:
            return 0.0
        if not self._ready:
            return None
        if self._urgent and not self._urgent.isdisjoint(self._ready):
            return 0.0
        if bucket_bytes > 0 and self._ready_bytes >= bucket_bytes:
            return 0.0
        oldest = next(iter(self._ready.values()))
        return max(0.0, oldest + hold_s - now)

    @property
    def joined(self) -> Set[int]:
        return set(self._joined)

    def pending_names(self) -> List[Tuple[str, float, List[int]]]:
        """(name, first_seen, ranks that submitted) for tensors still waiting for some rank."""
        pending = [(n, e.first_seen, sorted(e.requests)) for n, e in self._pending.items() if n not in self._ready]
        return pending + [(n, since, sorted(ranks)) for n, (since, ranks) in self._parked.items()]

    def has_partial(self) -> bool:
        """True while some tensor has been submitted by some ranks but not yet by all."""
        return len(self._pending) > len(self._ready) or bool(self._parked)

    def has_ready(self) -> bool:
        return bool(self._ready) or self._join_done

    # ----------------------------------------------------------------- output
    def take_ready(self) -> List[list]:
        """Pop everything ready as a wire response list: validated, fused and cache-compressed (a tensor every
        input of which came with the requests goes alone, as a CARRIED item: core/engine/carried.py).

        Members of a group are held back until the whole group is ready, then planned together.
        """
        out: List[list] = []
        responses: List[TensorResponse] = []
        group_units: List[List[TensorResponse]] = []
        cached: Set[str] = set()
        cached_ids: Dict[str, int] = {}
        for name in list(self._ready):
            entry = self._pending[name]
            request = next(iter(entry.requests.values()))
            group = request.group
            if group:
                members = self._group_ready.setdefault(group, [])
                if name not in members:
                    members.append(name)
                if len(members) < request.group_size:
                    continue
                del self._group_ready[group]
                names = members
            else:
                names = [name]
            unit = responses if not group else []
            if self.timeline is not None:
                self.timeline.end(names)           # QUEUE: emitted now
            for member in names:
                self._ready.pop(member, None)      # members held by an earlier call already left the order
                pending = self._pending.pop(member)
                requests = pending.requests
                inputs = (carried_inputs(request, pending.inputs, self.size, self.ranks)
                          if pending.inputs is not None and not group else None)
                if inputs is not None:
                    result = self._construct(member, requests)
                    if isinstance(result, str):
                        out.append([Tag.ERROR, [member], result])
                    else:
                        out.append([Tag.CARRIED, result.to_wire(), inputs])
                    continue
                cache_id = self.cache.lookup(member) if self.cache.enabled else None
                if cache_id is not None and self._matches_cache(cache_id, requests):
                    unit.append(self.cache.get(cache_id))
                    cached.add(member)
                    cached_ids[member] = cache_id
                    continue
                result = self._construct(member, requests)
                if isinstance(result, str):
                    out.append([Tag.ERROR, [member], result])
                    continue
                unit.append(result)
            if group:
                group_units.append(unit)
        # Held group members stay pending, out of the ready order, until their group completes.
        for members in self._group_ready.values():
            for member in members:
                self._ready.pop(member, None)
        self._ready_bytes = sum(_request_bytes(next(iter(self._pending[n].requests.values())))
                                for n in self._ready)
        self._urgent.intersection_update(self._pending)
        for batch in self._plan(responses, group_units):
            out.append([Tag.BATCH, [cached_ids[r.name] if r.name in cached else r.to_wire() for r in batch]])
        if self._join_done:
            out.append([Tag.JOINED, self.ranks[self._last_joined]])
            self._join_done = False
            self._joined.clear()
        if out:
            self.progress += 1
        return out

    def _plan(self, singles: List[TensorResponse],
              group_units: List[List[TensorResponse]]) -> List[List[TensorResponse]]:
        """Fused batches; with HOROVOD_DISABLE_GROUP_FUSION each group is fused only with itself."""
        if not self.disable_group_fusion:
            return fusion.plan(singles + [r for unit in group_units for r in unit], self.fusion_threshold)
        batches = fusion.plan(singles, self.fusion_threshold)
        for unit in group_units:
            batches.extend(fusion.plan(unit, self.fusion_threshold))
        return batches

    def _matches_cache(self, cache_id: int, requests: Dict[int, list]) -> bool:
        cached = self.cache.get(cache_id)
        return len(requests) == self.size and all(cached.request_matches(r, q) for r, q in requests.items())

    # ------------------------------------------------------------- validation
    def _differ(self, requests: Dict[int, list], key) -> Optional[str]:
        return _disagreement(requests, key, self.ranks)

    def _construct(self, name: str, requests: Dict[int, list]):
        """Validate the ranks' requests for ``name``; a TensorResponse or an error message."""
        first = requests[min(requests)]
        if first.rtype in _IDENTICAL_TYPES and len(requests) == self.size and \
                all(q == first for q in requests.values()):
            return self._response(name, first, list(first.shape), None)
        diff = self._differ(requests, lambda q: _OP_NAMES[q.rtype])
        if diff:
            return f"Mismatched operations for tensor '{name}': {diff.replace('sent', 'did an')}."
        rtype = RequestType(first.rtype)
        op_name = rtype.name
        diff = self._differ(requests, lambda q: _DTYPE_NAMES[q.dtype])
        if diff:
            return f"Mismatched data types for {op_name} of tensor '{name}': {diff}."
        diff = self._differ(requests, lambda q: "host memory" if q.device == HOST else "device memory")
        if diff:
            return (f"Mismatched devices for {op_name} of tensor '{name}': {diff.replace('sent', 'sent a tensor in')}. "
                    "Put the tensor on the same kind of device on every rank (and set HOROVOD_CUDA_IPC alike).")
        missing = [self.ranks[p] for p in sorted(set(range(self.size)) - set(requests))]
        if missing and rtype in _NOT_WITH_JOIN:
            return (f"{_NOT_WITH_JOIN[rtype]} is not supported with Join at this time: rank(s) "
                    f"{', '.join(map(str, missing))} joined before submitting tensor '{name}'. Make every rank "
                    "run the same collectives before it calls hvd.join().")
        if rtype in (RequestType.ALLREDUCE, RequestType.ADASUM, RequestType.BROADCAST, RequestType.REDUCESCATTER):
            diff = self._differ(requests, lambda q: list(q.shape))
            if diff:
                return f"Mismatched {op_name} tensor shapes for tensor '{name}': {diff}."
        if rtype in (RequestType.ALLREDUCE, RequestType.REDUCESCATTER, RequestType.ADASUM):
            diff = self._differ(requests, lambda q: _REDUCE_NAMES.get(q.reduce_op, q.reduce_op))
            if diff:
                return f"Mismatched reduce operations for {op_name} of tensor '{name}': {diff}."
            diff = self._differ(requests, lambda q: q.prescale)
            if diff:
                return f"Mismatched prescale factors for {op_name} of tensor '{name}': {diff}."
            diff = self._differ(requests, lambda q: q.postscale)
            if diff:
                return f"Mismatched postscale factors for {op_name} of tensor '{name}': {diff}."
        shape = list(first.shape)
        extra = None
        if rtype == RequestType.BROADCAST:
            diff = self._differ(requests, lambda q: q.root)
            if diff:
                return f"Mismatched BROADCAST root ranks for tensor '{name}': {diff.replace('sent', 'gave root')}."
            root = first.root
            if root not in self.ranks:
                if self.ranks == list(range(self.size)):
                    return (f"Invalid root rank {root} for BROADCAST of tensor '{name}': the job has {self.size} "
                            f"ranks (valid roots are 0..{self.size - 1}).")
                return (f"Invalid root rank {root} for BROADCAST of tensor '{name}': it is not in the process set "
                        f"(ranks {self.ranks}); the root is a global rank, one of the set's.")
        elif rtype == RequestType.REDUCESCATTER:
            if not shape:
                return f"Cannot REDUCESCATTER tensor '{name}': it is rank-zero (a scalar); give it a first dimension."
        elif rtype in (RequestType.ALLGATHER, RequestType.ALLTOALL):
            if any(len(q.shape) == 0 for q in requests.values()):
                scalar = [str(self.ranks[r]) for r, q in sorted(requests.items()) if not q.shape]
                return (f"Rank(s) {', '.join(scalar)} "
                        f"tried to {op_name} a rank-zero tensor '{name}'; give it a first dimension.")
            diff = self._differ(requests, lambda q: list(q.shape[1:]))
            if diff:
                return (f"Mismatched {op_name} tensor shapes for tensor '{name}': every dimension except the "
                        f"first must match across ranks, but {diff.replace('sent', 'sent rows of shape')}.")
            shape = shape[1:]
            if rtype == RequestType.ALLGATHER:
                extra = [requests[r].shape[0] if r in requests else 0 for r in range(self.size)]
            else:
                extra = [requests[r].splits for r in range(self.size)]
        return self._response(name, first, shape, extra)

    def _response(self, name: str, first: list, shape: List[int], extra) -> TensorResponse:
        return TensorResponse(name, first.rtype, first.dtype, shape, first.reduce_op, first.prescale,
                              first.postscale, first.root, extra, first.device)
