"""Framework-free rules for gradients that exist on some ranks and not on others (issue 28, item 5).

The gradient-reducing wrappers (torch's ``DistributedOptimizer``, TensorFlow's ``DistributedGradientTape`` and
``DistributedOptimizer``, the Keras optimizers) learn which gradients every rank has from one small collective:
each rank contributes a *presence vector* (``presence_vector``), slot 0 a 1 from every rank that takes part and
slot ``1 + i`` a 1 where gradient ``i`` is missing on this rank. Its sum (``Presence``) says, per gradient, on how
many ranks it is missing; only when that is neither none nor all of them do the ranks gather each other's flags to
name the ranks (``ranks_split``). The bindings run the collectives; here are the counts, the splits and the text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

# How many names one message lists before it says "and N more".
MAX_NAMES = 10


def presence_vector(missing: Sequence[bool], dtype=np.int32) -> np.ndarray:
    """``[1, missing_0, missing_1, ...]`` as ``dtype``: what one rank contributes to the sum."""
    vector = np.zeros(len(missing) + 1, dtype=dtype)
    vector[0] = 1
    vector[1:] = np.asarray(missing, dtype=bool)
    return vector


@dataclass
class Presence:
    """The summed presence vectors: ``active`` ranks took part (a rank that joined contributes zeros), and
    ``missing[i]`` of them had no gradient ``i``."""

    active: int
    missing: np.ndarray

    @classmethod
    def of(cls, summed: np.ndarray) -> Presence:
        """From the sum of every rank's ``presence_vector`` (rounded: a float sum may carry rounding)."""
        counts = np.rint(np.asarray(summed, dtype=np.float64)).astype(np.int64)
        return cls(int(counts[0]), counts[1:])

    def partial(self) -> List[int]:
        """The gradients missing on some of the active ranks but not on all of them."""
        return [int(i) for i in np.flatnonzero((self.missing > 0) & (self.missing < self.active))]

    def everywhere(self) -> List[int]:
        """The gradients missing on every active rank."""
        if self.active <= 0:
            return []
        return [int(i) for i in np.flatnonzero(self.missing >= self.active)]


def ranks_split(gathered: np.ndarray, index: int, ranks: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(ranks without gradient ``index``, ranks with it) from every rank's flags gathered row by row (row ``r``
    is the rank at position ``r`` of the set, whose global rank is ``ranks[r]``)."""
    rows = np.asarray(gathered).reshape(len(ranks), -1)
    without = [int(ranks[r]) for r in range(len(ranks)) if rows[r, index]]
    with_ = [int(ranks[r]) for r in range(len(ranks)) if not rows[r, index]]
    return without, with_


def quoted(names: Sequence[str], limit: int = MAX_NAMES) -> str:
    """``'a', 'b' and 3 more``: names for a message, at most ``limit`` of them."""
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    extra = len(names) - limit
    return f"{shown} and {extra} more" if extra > 0 else shown


def label(variable: object, index: int) -> str:
    """How a message names the variable of gradient ``index``: a Keras 3 variable's ``path``, else its ``name``
    (``dense/kernel:0``), else ``gradient #index``."""
    for attr in ("path", "name"):
        value = getattr(variable, attr, None) if variable is not None else None
        if isinstance(value, str) and value:
            return value
    return f"gradient #{index}"


def none_gradient_message(who: str, name: str, without: Optional[List[int]], with_: Optional[List[int]],
                          counts: Tuple[int, int], remedy: str) -> str:
    """The error every rank raises when gradient ``name`` is None on some ranks only. ``without``/``with_`` are
    the ranks (None when they could not be gathered: a rank joined); ``counts`` is (ranks without, active)."""
    if without is not None and with_ is not None:
        where = f"is None on rank(s) {without} but not on rank(s) {with_}"
    else:
        where = f"is None on {counts[0]} of the {counts[1]} ranks that took part"
    return (f"{who}: the gradient of variable '{name}' {where}. Every rank must have a gradient for the same "
            "variables, or their allreduces cannot match (the step would deadlock). A variable gets no gradient "
            "where the loss does not depend on it: a branch, layer or loss term used on some ranks only. "
            f"{remedy}")


def count_mismatch_message(who: str, count: int, negotiation_error: str) -> str:
    """The error when the ranks have different numbers of gradients (their presence vectors differ in length,
    which the coordinator reports as ``ranks 0, 2 sent [5]; rank 1 sent [3]``: one more than each count)."""
    found = re.findall(r"(ranks? [\d, ]+?) sent \[(\d+)\]", negotiation_error)
    if found:
        detail = "; ".join(f"{ranks} {'have' if ranks.startswith('ranks') else 'has'} {int(n) - 1}"
                           for ranks, n in found)
    else:
        detail = f"this rank has {count} ({negotiation_error})"
    return (f"{who}: the ranks have different numbers of variables to update ({detail}). Every rank must train "
            "the same variables: a layer that is built or called on some ranks only has variables there alone. "
            "Build and call the same layers on every rank (leave a layer's output out of the loss where it does "
            "not apply).")


def none_gradient_verdict(vector: np.ndarray, labels: Sequence[str], ranks: Sequence[int],
                          allreduce_sum: Callable[[np.ndarray], np.ndarray],
                          allgather: Callable[[np.ndarray], np.ndarray], who: str, remedy: str) -> Optional[str]:
    """The error message when some gradient is None on some ranks only, else None; the same on every rank.

    ``vector`` is this rank's ``presence_vector`` of the gradients named ``labels``; ``ranks`` the global ranks
    of the set's positions. ``allreduce_sum`` sums it across the set (one small collective, every step);
    ``allgather`` gathers the int8 flags row by row, and runs only when the sums show a partial gradient and no
    rank joined (an allgather refuses joined ranks): every rank then knows that from the same sums.
    """
    try:
        summed = allreduce_sum(np.array(vector, dtype=np.int32))
    except Exception as exc:      # the op layer's negotiation error, the same on every rank
        if "Mismatched" not in str(exc) or "shapes" not in str(exc):
            raise
        return count_mismatch_message(who, len(vector) - 1, str(exc))
    counts = Presence.of(summed)
    partial = counts.partial()
    if not partial:
        return None
    first = partial[0]
    without = with_ = None
    if counts.active == len(ranks):
        gathered = allgather(np.ascontiguousarray(np.asarray(vector[1:], dtype=np.int8)))
        without, with_ = ranks_split(gathered, first, ranks)
    message = none_gradient_message(who, labels[first], without, with_, (int(counts.missing[first]), counts.active),
                                    remedy)
    if len(partial) > 1:
        message += f" (Also None on some ranks only: {quoted([labels[i] for i in partial[1:]])}.)"
    return message


# ------------------------------------------------------------------------------------------------ rank masks
# A Sum of one bit per rank names the ranks without a second collective: rank p of a set contributes bit p % 63
# of int64 word p // 63 (63 bits, so that the sum of distinct bits never reaches the sign bit).
WORD_BITS = 63


def words_for(size: int) -> int:
    """int64 words per mask for a set of ``size`` ranks."""
    return max(1, -(-size // WORD_BITS))


def rank_mask_vector(missing: Sequence[bool], position: int, size: int) -> np.ndarray:
    """What the rank at ``position`` of a set of ``size`` contributes to a Sum: mask 0 has its bit (it took part;
    a rank that joined contributes zeros), mask ``1 + i`` has it where gradient ``i`` is missing here. int64,
    ``(1 + n) * words_for(size)`` long."""
    out = np.zeros((1 + len(missing), words_for(size)), dtype=np.int64)
    word, bit = divmod(position, WORD_BITS)
    out[0, word] = 1 << bit
    out[1:, word][np.asarray(missing, dtype=bool)] = 1 << bit
    return out.reshape(-1)


class RankMasks:
    """The Sum of every rank's ``rank_mask_vector``: which positions took part, and which lacked each gradient."""

    def __init__(self, summed: np.ndarray, size: int) -> None:
        self.masks = np.asarray(summed, dtype=np.int64).reshape(-1, words_for(size))

    def any_missing(self) -> bool:
        """Whether some gradient is missing on some rank (the usual step: no)."""
        return bool(self.masks[1:].any())

    @staticmethod
    def _positions(words: np.ndarray) -> List[int]:
        return [w * WORD_BITS + b for w, value in enumerate(words.tolist()) for b in range(WORD_BITS)
                if value >> b & 1]

    def took_part(self) -> List[int]:
        """Positions of the ranks that took part."""
        return self._positions(self.masks[0])

    def missing(self, index: int) -> List[int]:
        """Positions of the ranks without gradient ``index``."""
        return self._positions(self.masks[1 + index])

    def partial(self) -> List[int]:
        """Gradients missing on some of the ranks that took part, not all."""
        rows = self.masks[1:]
        return np.flatnonzero(rows.any(axis=1) & ~(rows == self.masks[0]).all(axis=1)).tolist()

    def everywhere(self) -> List[int]:
        """Gradients missing on every rank that took part."""
        if not self.masks[0].any():
            return []
        return np.flatnonzero((self.masks[1:] == self.masks[0]).all(axis=1)).tolist()
