"""Unused parameters of torch's ``DistributedOptimizer``, named once instead of silently zero-filled.

A parameter gets no gradient on a step when the loss does not depend on it (its accumulation hook never fires,
``p.grad`` stays None or stale). As upstream, the optimizer still allreduces a zero gradient for it, so that every
rank submits the same allreduces and nothing waits for ever. That hides two mistakes, which this module reports
through ``logging`` (logger ``horovod.torch``), once per parameter, on the set's first rank:

- **some ranks but not others** (a branch taken on some ranks only): the average then mixes real gradients with
  zeros from the other ranks. Reported the first time it happens, with the ranks on either side.
- **every rank for** :data:`STEPS_IN_A_ROW` **steps in a row** (a frozen branch, a head that is not used): zeros
  are allreduced every step, and momentum or weight decay still move the parameter. The remedy is
  ``find_unused_parameters``'s: leave the parameter out of the optimizer (and of ``named_parameters``), or set
  ``requires_grad=False`` before wrapping the optimizer.

**How the ranks learn it, cheaply.** Only the ranks together know the first case. At the end of each
``synchronize``, once the gradients are done, every rank submits one more allreduce (Sum, int64) of *rank masks*
(``horovod.common.gradient_presence.rank_mask_vector``): its own bit in mask 0 (it took part; a rank that joined
contributes zeros) and in mask ``1 + i`` for each parameter ``i`` that got no gradient here; ``(n + 1) * 8``
bytes for ``n`` parameters (one more word per mask for every 63 ranks). The sum names the ranks on either side
with no second collective. Nobody waits for it: the next ``synchronize`` polls it at its end, by when the
coordinator has emitted it with that step's gradients (it emits everything ready when a rank waits on a
gradient, and the masks were ready before those gradients), so it is complete (59 of 59 steps measured; the poll
and the usual step's comparison take about 50 µs); were it not (a peer that skipped a step), that step's masks
are not sent, so no step can hang on them. Waiting for them in their own step instead cost a coordinator round
trip after the gradients (about 1.5 ms per step on the loaded 2-core VM), and an allreduce that nobody waits on
is emitted only after about 25 ms, so they are read one step later, not sooner: a report comes one step late.
What to report is decided locally from the sum (it is the same everywhere), and only the set's first rank logs.
In a set of one rank there is nothing to exchange and the local flags are read at once.

Where the set has fast rounds (every rank on one host, core/engine/fast_rounds.py), the sum is a blocking
allreduce instead, read at once: one fast round costs tens of microseconds, and a sum left in flight would keep
the next step's small gradients from their own fast round (the optimizer's ``_small_gradients``: a rank with an
op in flight posts no fast round), sending them through the coordinator (a 2-rank MLP step: 1.2 ms against
0.4 ms for the gradients and the sum as two fast rounds). Reports then come in their own step.

There, the usual step needs no round of its own at all: with op Average or Sum, the optimizer's grouped
allreduce of small gradients carries one more float32, each rank's count of parameters without a gradient
(:meth:`UnusedParameters.count`). Its reduction (non-negative counts, positive scale factors) is zero exactly
when no rank missed any; only otherwise do the ranks, all alike, exchange the masks above in a blocking round,
in the same step. A 2-rank 784-128-10 MLP step saved that round's 80-140 µs (docs/benchmarks.md).
"""
from __future__ import annotations

import logging
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from horovod.common import gradient_presence as presence
from horovod.common.types import Sum
from horovod.core import basics, housekeeping, ops
from horovod.core.process_sets import ProcessSet

log = logging.getLogger("horovod.torch")  # a named channel: see horovod.common.logging_setup

# A parameter that gets no gradient on every rank for this many consecutive steps is reported.
STEPS_IN_A_ROW = 3
WHO = "horovod.torch.DistributedOptimizer"


_named: Dict[str, int] = {}           # tensor name -> optimizers made with it, in this initialization
_named_generation: List[Optional[int]] = [None]


def _tensor_name(names: Sequence[str]) -> str:
    """The presence sum's tensor name: the same on every rank that builds the same optimizers in the same order
    (a digest of the parameter names, and which optimizer with those names this is, counted since the last
    ``hvd.init``), different for two optimizers that are stepped one after the other."""
    if _named_generation[0] != basics.generation():
        _named.clear()
        _named_generation[0] = basics.generation()
    base = f"horovod.unused_parameters.{len(names)}.{zlib.crc32(chr(10).join(names).encode()) & 0xFFFFFFFF:08x}"
    _named[base] = _named.get(base, 0) + 1
    return f"{base}.{_named[base]}"


class UnusedParameters:
    """Per-step bookkeeping of the parameters without a gradient (see the module docstring).

    ``named``: the optimizer's trainable (name, parameter) pairs in the same order on every rank (sorted by
    name).
    """

    def __init__(self, named: Sequence[Tuple[str, torch.Tensor]], process_set: ProcessSet) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.process_set = process_set
        self.tensor_name = _tensor_name(self.names)
        self.step = 0
        self._in_a_row = np.zeros(len(self.names), dtype=np.int64)
        self._reported_partial = np.zeros(len(self.names), dtype=bool)
        self._reported_everywhere = np.zeros(len(self.names), dtype=bool)
        self._pending: Optional[tuple] = None

    # ---------------------------------------------------------------- collective
    def count(self, missing: Sequence[torch.Tensor]) -> int:
        """How many of the parameters ``missing`` this check follows (what this rank adds to the gradients'
        flag, see the module docstring)."""
        index = self._index
        return sum(1 for p in missing if id(p) in index)

    def record(self, missing: Sequence[torch.Tensor], missing_anywhere: Optional[float] = None) -> None:
        """Count a step whose parameters ``missing`` got no gradient on this rank: report what the previous
        step's sum showed, then submit this step's masks (see the module docstring). Call it on every rank at
        the end of every ``synchronize``, after the gradients' waits. ``missing_anywhere``: the reduction of
        every rank's :meth:`count`, where it went with the gradients (the same on every rank): zero, and no
        masks are exchanged."""
        self.step += 1
        size = ops.set_size(self.process_set)
        if missing_anywhere is not None and size > 1:
            self.flush()        # only a sum from before an elastic reset can be pending here: dropped
            if not missing_anywhere:
                self._in_a_row[:] = 0       # nothing missing anywhere: no run of steps goes on
                return
        flags = np.zeros(len(self.names), dtype=bool)
        for p in missing:
            i = self._index.get(id(p))
            if i is not None:
                flags[i] = True
        if size == 1:
            if flags.any() or self._in_a_row.any():
                self._examine(self.step, presence.RankMasks(presence.rank_mask_vector(flags, 0, 1), 1))
            return
        if missing_anywhere is None and not self.flush():
            return          # the previous sum is not complete yet (it normally is): this step is not sent
        vector = presence.rank_mask_vector(flags, ops.set_rank(self.process_set), size)
        if missing_anywhere is not None or ops.has_fast_rounds(self.process_set):
            # One blocking fast round (tens of microseconds), at once: an async sum left in flight would keep the
            # next step's gradients from a fast round of their own.
            with ops.blocking():
                summed = ops.allreduce_async(vector, vector, self.tensor_name, Sum, process_set=self.process_set).wait()
            self._read(self.step, presence.RankMasks(summed, size))
            return
        handle = ops.allreduce_async(vector, vector, self.tensor_name, Sum, process_set=self.process_set)
        housekeeping.track(self.process_set.process_set_id or 0, handle)
        self._pending = (basics.generation(), self.step, size, handle)

    def flush(self) -> bool:
        """Report what the last submitted sum shows, if it is complete (it normally is, long since), and return
        True; False while it is not, so that no second one is submitted under its name. Never waits: a peer
        that skipped a step (or, after an elastic reset, named its optimizer differently) can only delay or
        silence the report, never hang a step. A sum from before Horovod was initialized again is dropped."""
        pending = self._pending
        if pending is None:
            return True
        generation, step, size, handle = pending
        if generation == basics.generation() and not handle.poll():
            return False
        self._pending = None
        if generation != basics.generation():
            return True
        self._read(step, presence.RankMasks(handle.wait(), size))
        return True

    def _read(self, step: int, masks: presence.RankMasks) -> None:
        """Report what ``step``'s summed masks show, if anything (the usual step: nothing to report)."""
        if masks.any_missing() or self._in_a_row.any():
            self._examine(step, masks)

    def _examine(self, step: int, masks: presence.RankMasks) -> None:
        """Report ``step``'s parameters missing on some ranks (the first time for each) and the ones missing
        everywhere for :data:`STEPS_IN_A_ROW` steps in a row."""
        ranks = ops.set_ranks(self.process_set)
        took_part = masks.took_part()
        new = [i for i in masks.partial() if not self._reported_partial[i]]
        self._reported_partial[new] = True
        by_split: Dict[tuple, List[int]] = {}
        for i in new:
            without = masks.missing(i)
            split = (tuple(ranks[p] for p in without), tuple(ranks[p] for p in took_part if p not in without))
            by_split.setdefault(split, []).append(i)
        for (without, with_), group in by_split.items():
            self._warn(self._partial_message(step, group, list(without), list(with_)))
        everywhere = np.zeros(len(self.names), dtype=bool)
        everywhere[masks.everywhere()] = True
        self._in_a_row = np.where(everywhere, self._in_a_row + 1, 0)
        due = np.flatnonzero((self._in_a_row >= STEPS_IN_A_ROW) & ~self._reported_everywhere)
        if len(due):
            self._reported_everywhere[due] = True
            self._warn(self._everywhere_message(step, [int(i) for i in due], len(took_part)))

    # ---------------------------------------------------------------- reports
    def _partial_message(self, step: int, indices: List[int], without: List[int], with_: List[int]) -> str:
        names = [self.names[i] for i in indices]
        noun = "parameter" if len(names) == 1 else "parameters"
        return (f"{WHO}: {noun} {presence.quoted(names)} got no gradient on rank(s) {without} but did on rank(s) "
                f"{with_} at step {step}. Horovod averaged zeros from the ranks without a gradient into the "
                "others' (so that no rank waits), which shrinks the update. Make the loss depend on the same "
                "parameters on every rank (a branch, layer or loss term used on some ranks only causes this). "
                "Reported once per parameter.")

    def _everywhere_message(self, step: int, indices: List[int], active: int) -> str:
        names = [self.names[i] for i in indices]
        one = len(names) == 1
        noun, it, they = ("parameter", "it", "it is") if one else ("parameters", "them", "they are")
        if ops.set_size(self.process_set) == 1:
            where, cost = "on this rank", (f"On more ranks Horovod would allreduce a zero gradient for {it} every "
                                           "step.")
        else:
            where, cost = f"on any of the {active} ranks", (
                f"Horovod allreduces a zero gradient for {it} every step, which costs bandwidth and lets momentum "
                f"or weight decay still move {it}.")
        return (f"{WHO}: {noun} {presence.quoted(names)} got no gradient {where} for {STEPS_IN_A_ROW} steps in a "
                f"row (steps {step - STEPS_IN_A_ROW + 1}-{step}). {cost} If {they} unused on purpose, "
                f"leave {it} out of the optimizer and of named_parameters, or set requires_grad=False on {it} "
                "before creating the DistributedOptimizer (what DDP's find_unused_parameters would point to). "
                "Reported once per parameter.")

    def _warn(self, message: str) -> None:
        if ops.set_rank(self.process_set) == 0:
            log.warning(message)


def missing_parameters(optimizer) -> List[torch.Tensor]:
    """The trainable parameters without a gradient this step: those whose hook did not fire (when hooks are
    registered), else those whose ``.grad`` is None."""
    if optimizer._requires_update:
        seen = {id(p) for p in optimizer._handles}
        return [p for p in optimizer._unused.params if id(p) not in seen]
    return [p for p in optimizer._unused.params if p.grad is None]
