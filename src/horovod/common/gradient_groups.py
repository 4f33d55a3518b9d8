"""Framework-free rules shared by the gradient-reducing wrappers (TF tape, Keras optimizers, torch's
``DistributedOptimizer``): how gradients are split into grouped allreduces, and how ``gradient_predivide_factor``
turns into pre/post scale factors."""
from __future__ import annotations

from typing import Any, Callable, Hashable, List, Optional, Sequence, Tuple, Union

from horovod.common.types import Average, ReduceOp
from horovod.common.util import split_list

Groups = Union[None, int, Sequence[Sequence[object]]]


def check_groups(groups: Groups, num_groups: int = 0) -> Groups:
    """Validate ``groups`` (an int or a list of lists of variables) and fold in the deprecated ``num_groups``."""
    if num_groups and groups is None:
        groups = num_groups
    if groups is not None and not isinstance(groups, (int, list, tuple)):
        raise ValueError("groups should be an int or a list of lists of variables, "
                         f"got {type(groups).__name__}")
    return groups


def check_predivide(op: ReduceOp, gradient_predivide_factor: float) -> None:
    """Upstream's ValueError for a ``gradient_predivide_factor`` with an op other than Average."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")


def scale_factors(op: ReduceOp, gradient_predivide_factor: float) -> Tuple[float, float]:
    """(prescale, postscale) for a gradient allreduce: Average divides by ``gradient_predivide_factor`` before the
    sum and multiplies it back after (the engine's Average then divides by the size). Every other op, Adasum
    included, is unscaled (upstream's ``_make_cached_allreduce_grads_fn``): Adasum is scale-invariant and does
    its own weighting, so neither a predivide factor nor an average applies to it."""
    op = ReduceOp(op)
    check_predivide(op, gradient_predivide_factor)
    if op == Average:
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


def split_into_groups(indices: List[int], variables: Optional[Sequence[object]], groups: Groups,
                      key: Callable[[object], Hashable] = id) -> List[List[int]]:
    """Split the positions ``indices`` of dense gradients into the grouped allreduces to issue.

    ``groups`` None/0: one group. An int: that many contiguous groups. A list of lists of variables: those
    variables' gradients go together (matched by object identity), every other gradient alone.
    """
    if not indices:
        return []
    if isinstance(groups, int) and groups > 0:
        return [p for p in split_list(indices, min(groups, len(indices))) if p]
    if isinstance(groups, (list, tuple)) and groups and variables is not None:
        group_of = {key(v): gi for gi, group in enumerate(groups) for v in group}
        parts: dict = {}
        for i in indices:
            parts.setdefault(group_of.get(key(variables[i]), -1 - i), []).append(i)
        return list(parts.values())
    return [list(indices)]


def fixed_groups(groups: Groups, variables: Sequence[object], member_type: type) -> Optional[List[List[object]]]:
    """The groups of a wrapper that must know them before any gradient exists (torch's ``DistributedOptimizer``
    starts a group's allreduce from a hook as soon as its last member's gradient is ready).

    ``groups`` None/0: no groups (every gradient alone). An int: that many contiguous groups of ``variables``
    (as :func:`split_into_groups`). Lists of variables: those lists, in their order, after checking that each
    member is a ``member_type`` and none is in two groups; variables in no list are reduced alone.
    """
    if groups is None or groups == 0:
        return None
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups must be a non-negative integer or a list of lists of parameters")
        positions = split_into_groups(list(range(len(variables))), variables, groups)
        return [[variables[i] for i in part] for part in positions]
    out, seen = [], set()
    for group in groups:
        group = list(group)
        for v in group:
            if not isinstance(v, member_type):
                raise ValueError(f"groups must be a list of lists of {member_type.__module__}."
                                 f"{member_type.__name__} (parameters)")
            if id(v) in seen:
                raise ValueError("a parameter appears in more than one group")
            seen.add(id(v))
        out.append(group)
    return out


def allreduce_in_groups(out: List[Any], indices: List[int], variables: Optional[Sequence[object]], groups: Groups,
                        compression: Any, grouped_allreduce: Callable[[List[Any], str], List[Any]], name: str,
                        key: Callable[[object], Hashable] = id) -> None:
    """Replace ``out[i]`` for each ``i`` in ``indices`` by its reduction: one compressed grouped allreduce per
    group of ``split_into_groups``, named ``<name>.group<p>``. ``grouped_allreduce(tensors, name)`` is the
    framework's op with the op and scale factors bound."""
    for p, part in enumerate(split_into_groups(indices, variables, groups, key)):
        compressed = [compression.compress(out[i]) for i in part]
        reduced = grouped_allreduce([c for c, _ in compressed], f"{name}.group{p}")
        for i, r, (_, ctx) in zip(part, reduced, compressed):
            out[i] = compression.decompress(r, ctx)
