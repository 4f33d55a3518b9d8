"""Broadcast helpers for model parameters, optimizer state and Python objects (upstream's ``functions.py``)."""
from __future__ import annotations

import collections
from typing import Any, Iterable, List, Optional, Union

import torch

from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch.mpi_ops import broadcast_async_, rank, synchronize


def broadcast_parameters(params: Union[dict, Iterable], root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Broadcast ``params`` in place from ``root_rank``: a ``state_dict()``, or tensors / (name, tensor) pairs.

    Dicts are broadcast in sorted key order so that every rank issues the same names in the same order.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or isinstance(params, tuple) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"param.{i}", p) for i, p in enumerate(items)]
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}: pass a dict or a list of tensors")
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError(f"parameter {name!r} is a {type(p).__name__}, not a tensor")
        if p.is_sparse:
            raise ValueError(f"parameter {name!r} is sparse; broadcast its dense form instead")
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p, root_rank,
                                        name=f"broadcast_parameters.{name}", process_set=process_set))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Optional[torch.nn.Module] = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Broadcast an optimizer's state (tensors and scalar options such as lr) from ``root_rank``.

    Optimizers whose state is still empty get it materialised first, as upstream does: every trainable
    parameter gets a zero gradient (sparse for ``SparseAdam``, and for ``SGD`` on the sparse embeddings of
    ``model``) and the underlying optimizer steps once. Parameters that had no gradient keep that zero gradient
    afterwards (as upstream); gradients that existed are put back, and unlike upstream the parameters are
    restored too, so that the materialising step never moves the model. Parameters with
    ``requires_grad=False`` are left alone (no gradient, no state).

    A ``DistributedOptimizer`` with ``Compression.powersgd`` also takes the root's PowerSGD step count and
    warm-start Qs; each rank keeps its own error feedback (docs/compression.md).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _materialise_state(optimizer, _sparse_parameter_ids(model))
        state_dict = optimizer.state_dict()

    # Scalar options (lr, momentum, betas, ...) go as one object; tensors are broadcast in place.
    options = [{k: v for k, v in group.items() if k != "params"} for group in state_dict["param_groups"]]
    options = broadcast_object(options, root_rank, name="broadcast_optimizer_state.options",
                               process_set=process_set)
    for group, opts in zip(optimizer.param_groups, options):
        for key, value in opts.items():
            group[key] = value

    tensors = []
    scalars = collections.OrderedDict()
    for pid in sorted(state_dict["state"]):
        for key, value in sorted(state_dict["state"][pid].items()):
            if torch.is_tensor(value):
                tensors.append((f"{pid}.{key}", value))
            else:
                scalars[f"{pid}.{key}"] = value
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    scalars = broadcast_object(scalars, root_rank, name="broadcast_optimizer_state.scalars", process_set=process_set)
    params = _params_by_state_id(optimizer)
    for full_key, value in scalars.items():
        pid, key = full_key.split(".", 1)
        param = params.get(int(pid))
        if param is not None and param in optimizer.state:
            optimizer.state[param][key] = value
    # State a DistributedOptimizer keeps beside the wrapped optimizer's (PowerSGD's step count and Qs).
    broadcast_extra_state = getattr(optimizer, "_horovod_broadcast_extra_state", None)
    if broadcast_extra_state is not None:
        broadcast_extra_state(root_rank, process_set)


def _sparse_parameter_ids(model: Optional[torch.nn.Module]) -> set:
    """ids of the parameters of ``model``'s sparse embeddings (their gradients are sparse)."""
    if model is None:
        return set()
    return {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse
            for p in m.parameters()}


def _materialise_state(optimizer: torch.optim.Optimizer, sparse_ids: set) -> None:
    """Create an empty optimizer's state with one zero-gradient step of the underlying optimizer."""
    sparse_optimizer = isinstance(optimizer, torch.optim.SparseAdam)
    saved, seen = [], set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            saved.append((p, p.grad, p.detach().clone()))
            zero = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if sparse_optimizer or (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids):
                zero = zero.to_sparse(1)
            p.grad = zero
    # A DistributedOptimizer's own step() would allreduce, which needs every rank: step the wrapped class.
    inner = getattr(optimizer, "_horovod_inner_step", None)
    if inner is not None:
        inner()
    else:
        optimizer.step()
    with torch.no_grad():
        for p, grad, value in saved:
            p.copy_(value)
            if grad is not None:
                p.grad = grad


def _params_by_state_id(optimizer: torch.optim.Optimizer) -> dict:
    """state_dict's integer parameter ids -> parameter tensors (the order torch uses)."""
    ids, index = {}, 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            ids[index] = p
            index += 1
    return ids


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank (cloudpickle between authenticated peers)."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Gather one picklable object from every rank of ``process_set`` (the job by default), as a list in the
    order of the set's ranks. ``process_set`` is ours: upstream's torch version has only ``obj`` and ``name``."""
    return ops.allgather_object(obj, name, process_set)


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object", "rank"]
