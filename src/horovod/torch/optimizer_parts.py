"""What torch's two ``DistributedOptimizer`` classes share (the averaging one in ``optimizer.py``, the Adasum
delta optimizer in ``adasum_optimizer.py``): upstream's checks of ``named_parameters``, the per-parameter count
of backward passes, and the guard of ``zero_grad``."""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import torch


def find_duplicates(items: Iterable) -> set:
    """The elements of ``items`` that occur more than once."""
    seen, duplicates = set(), set()
    for element in items:
        if element in seen:
            duplicates.add(element)
        seen.add(element)
    return duplicates


def checked_named_parameters(param_groups: List[dict], named_parameters) -> List[Tuple[str, torch.Tensor]]:
    """``named_parameters`` (default: ``allreduce.noname.<group>.<index>``) sorted by name, after upstream's
    checks: (name, parameter) tuples, unique names, and every parameter of ``param_groups`` named."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                         "by model.named_parameters().")
    duplicates = find_duplicates([k for k, _ in named_parameters])
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(sorted(duplicates)))
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = [p for group in param_groups for p in group["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         "Python object ids: " + ", ".join(str(id(p)) for p in unnamed))
    return sorted(named_parameters, key=lambda kv: kv[0])


def count_backward_pass(handles: Dict[torch.Tensor, tuple], delay: Dict[torch.Tensor, int], p: torch.Tensor) -> bool:
    """Count one backward pass of ``p`` (from its gradient hook); True when this pass completes
    ``backward_passes_per_step`` and ``p``'s exchange should start. Upstream's AssertionError when ``p``'s
    exchange already started and its gradient is computed again before ``step()``."""
    if p in handles and handles[p][0] is not None and delay[p] <= 0:
        raise AssertionError(
            "Gradients were computed more than backward_passes_per_step times before call to step(). "
            "Increase backward_passes_per_step to accumulate gradients locally.")
    assert not p.grad.requires_grad
    assert delay[p] > 0
    delay[p] -= 1
    return delay[p] == 0


def check_nothing_pending(handles: dict) -> None:
    """Upstream's guard of ``zero_grad``: no exchange may be in flight (its result is written into the grads)."""
    if handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                             "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                             "a race condition.")


def register_gradient_hooks(optimizer, zero_grads: bool = False) -> None:
    """Hook ``optimizer._make_hook(p)`` after the gradient accumulation of every trainable parameter, recorded
    in ``optimizer._requires_update`` and ``optimizer._hook_handles``. ``zero_grads`` gives every such
    parameter a zero gradient first (upstream's delta optimizer does)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                if zero_grads:
                    p.grad = p.data.new(p.size()).zero_()
                optimizer._requires_update.add(p)
                optimizer._hook_handles.append(p.register_post_accumulate_grad_hook(optimizer._make_hook(p)))


def set_passes(optimizer, passes: int) -> None:
    """``set_backward_passes_per_step``: the new count, and every parameter's countdown restarted."""
    if passes <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    optimizer.backward_passes_per_step = passes
    for p in optimizer._allreduce_delay:
        optimizer._allreduce_delay[p] = passes
