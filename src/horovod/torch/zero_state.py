"""State dicts of ``ZeroRedundancyOptimizer`` (``horovod.torch.zero_optimizer``).

Each rank's ``.optim`` holds the state of the parameters it owns, under its own (local) parameter ids. A whole
state dict uses the ids a plain optimizer over every parameter would: positions in ``param_groups``, counted
across the groups. ``consolidate`` gathers the shards (serialized with ``torch.save``, one alltoall that sends
them all to one rank, or an allgather for every rank), ``full_state_dict`` returns what was gathered, and
``load`` keeps a copy of this rank's shard of a whole state dict.
"""
from __future__ import annotations

import copy
import io
from typing import Any, Dict, List, Optional, Protocol

import torch

from horovod.core import ops
from horovod.core.process_sets import ProcessSet
from horovod.torch.mpi_ops import allgather_async, alltoall_async, synchronize


class Sharded(Protocol):
    """What the state dicts need of their optimizer (``zero_optimizer.ZeroRedundancyOptimizer`` is one)."""

    rank: int                       # this rank's position in the process set
    process_set: ProcessSet
    param_groups: List[Dict[str, Any]]
    optim: torch.optim.Optimizer    # the optimizer of this rank's own parameters (local ids)
    _params: List[torch.Tensor]     # every parameter, in param_groups order
    _owner: Dict[int, int]          # parameter index -> the rank that owns it
    _name: str                      # the prefix of the collectives' names
    _consolidated: Optional[Dict[int, dict]]    # the whole state gathered here, by whole-state ids

    def _check_membership(self) -> None:
        """Raise when the process set changed since the parameters were partitioned."""

    def _distributed(self) -> bool:
        """More than one rank shares the state."""

    def _sync_param_groups(self, source: List[dict], target: List[dict]) -> None:
        """Copy the groups' options (all but ``params``) from ``source`` to ``target``."""


def _owned_indices(opt: Sharded) -> List[int]:
    """The whole-state ids of this rank's parameters, in the order of ``.optim``'s (local) ids."""
    return [i for i in range(len(opt._params)) if opt._owner[i] == opt.rank]


def shard(opt: Sharded) -> Dict[int, dict]:
    """This rank's state, keyed by whole-state ids."""
    owned = _owned_indices(opt)
    return {owned[local]: value for local, value in opt.optim.state_dict()["state"].items()}


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> Any:
    # Between authenticated peers of one job, as broadcast_object's cloudpickle.
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=False)


def consolidate(opt: Sharded, to: Optional[int]) -> None:
    """Gather every shard to global rank ``to`` of the process set (every rank of it when ``to`` is None)."""
    opt._check_membership()
    opt._sync_param_groups(opt.param_groups, opt.optim.param_groups)
    ranks = ops.set_ranks(opt.process_set)
    if opt.process_set.included() and to is not None and to not in ranks:
        raise ValueError(f"consolidate_state_dict(to={to}): rank {to} is not in {opt.process_set}; pass one of "
                         f"its global ranks {ranks}, or to=None for every rank.")
    if not opt._distributed():          # one rank, or a rank outside the set: the whole state is here
        opt._consolidated = copy.deepcopy({i: _on_cpu(s) for i, s in shard(opt).items()})
        return
    payload = _to_bytes(shard(opt))
    name = f"{opt._name}.consolidate"
    if to is None:
        sizes = synchronize(allgather_async(torch.tensor([payload.numel()]), name=f"{name}.sizes",
                                            process_set=opt.process_set)).tolist()
        data = synchronize(allgather_async(payload, name=name, process_set=opt.process_set))
    else:
        splits = [0] * len(ranks)
        splits[ranks.index(to)] = payload.numel()
        data, received = synchronize(alltoall_async(payload, splits=splits, name=name, process_set=opt.process_set))
        sizes = received.tolist()
    if to is not None and ops.set_rank(opt.process_set) != ranks.index(to):
        opt._consolidated = None
        return
    merged: Dict[int, dict] = {}
    for part in torch.split(data, sizes):
        merged.update(_from_bytes(part))
    opt._consolidated = merged


def _on_cpu(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    return value


def full_state_dict(opt: Sharded) -> Dict[str, Any]:
    """The consolidated state with this optimizer's current ``param_groups`` (a plain optimizer's layout)."""
    if opt._consolidated is None:
        here = ops.set_ranks(opt.process_set)[opt.rank] if opt._distributed() else "this rank"
        raise RuntimeError("The optimizer state has not been consolidated on this rank: ZeroRedundancyOptimizer "
                           f"keeps only a shard of it on each rank. Call consolidate_state_dict(to={here}) on "
                           "every rank of the process set first (to=None consolidates on every rank).")
    opt._sync_param_groups(opt.optim.param_groups, opt.param_groups)
    state_dict = torch.optim.Optimizer.state_dict(opt)           # param_groups with whole-state ids
    state_dict["state"] = {i: opt._consolidated[i] for i in sorted(opt._consolidated)}
    return state_dict


def load(opt: Sharded, state_dict: Dict[str, Any]) -> None:
    """Keep copies of this rank's shard of ``state_dict`` (ids matched to parameters by position in the groups,
    as a plain optimizer's ``load_state_dict`` does) and take its options; ``state_dict`` is left unchanged."""
    groups, saved_groups = opt.param_groups, state_dict["param_groups"]
    if len(groups) != len(saved_groups):
        raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups, this optimizer has "
                         f"{len(groups)}")
    local_state: Dict[int, Any] = {}
    local_groups = []
    index = local = 0
    for group, saved in zip(groups, saved_groups):
        if len(group["params"]) != len(saved["params"]):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of the "
                             f"optimizer's group ({len(saved['params'])} parameters against "
                             f"{len(group['params'])})")
        ids = []
        for saved_id in saved["params"]:
            if opt._owner[index] == opt.rank:
                if saved_id in state_dict["state"]:
                    local_state[local] = copy.deepcopy(state_dict["state"][saved_id])
                ids.append(local)
                local += 1
            index += 1
        local_groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
    opt.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
    opt._sync_param_groups(saved_groups, opt.param_groups)
    opt._consolidated = None
