"""``TorchState``: the elastic state of a PyTorch training job. Models, optimizers and ``ElasticSampler``s get
handlers (saved as deep copies of their state dicts, synced by broadcast from rank 0); anything else is a plain
object. ``set_handler_registry`` extends the registry, as upstream's."""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple, Type

import torch

from horovod.common.elastic import ObjectState
from horovod.torch import zero_state
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovod.torch.mpi_ops import rank
from horovod.torch.zero_optimizer import ZeroRedundancyOptimizer


class TorchState(ObjectState):
    """State of a PyTorch training process: ``model``, ``optimizer`` and any other keyword arguments become
    attributes; assigning a tracked model, optimizer or sampler attribute saves it at once."""

    def __init__(self, model=None, optimizer=None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


class StateHandler:
    """Saves, restores and syncs one kind of tracked object."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """An object with ``state_dict()`` / ``load_state_dict()``: saved as a deep copy of its state dict."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def restore(self) -> None:
        """Load a copy of the commit: torch's ``Optimizer.load_state_dict`` keeps the tensors it is given (no
        copy when dtype and device already match), so loading the saved ones would let the steps after this
        restore change them, and a second failure before the next commit would restore those steps. (Upstream
        loads the saved dict itself.)"""
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class ZeroOptimizerStateHandler(StateHandler):
    """A ``ZeroRedundancyOptimizer``, whose ranks each hold a shard of the state. A commit consolidates the whole
    state on every rank (an allgather; each rank then holds a host copy of all of it, as for a plain optimizer),
    so that it survives the loss of any rank. A sync after a reset re-partitions the parameters for the new
    size and loads rank 0's copy. Until the first commit the copy is this rank's own shard, merged at the
    first sync (which runs when no rank was lost yet, unless a rank fails before the first commit)."""

    def __init__(self, value: ZeroRedundancyOptimizer) -> None:
        super().__init__(value)
        self._saved = self._own_shard()
        self._whole = False

    def _own_shard(self) -> Dict[str, Any]:
        groups = torch.optim.Optimizer.state_dict(self.value)["param_groups"]
        return {"state": copy.deepcopy(zero_state.shard(self.value)), "param_groups": copy.deepcopy(groups)}

    def save(self) -> None:
        self.value.consolidate_state_dict(to=None)
        self._saved, self._whole = self.value.state_dict(), True

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value._reshard()
        if broadcast_object(self._whole, root_rank=0, name="ZeroOptimizerStateHandler.whole"):
            saved = broadcast_object(self._saved if rank() == 0 else None, root_rank=0,
                                     name="ZeroOptimizerStateHandler.saved")
        else:
            shards = allgather_object(self._saved, name="ZeroOptimizerStateHandler.shards")
            saved = {"state": {k: v for shard in shards for k, v in shard["state"].items()},
                     "param_groups": shards[0]["param_groups"]}
        self.value.load_state_dict(saved)
        self._saved, self._whole = saved, True


class SamplerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry: List[Tuple[Type, Type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (ZeroRedundancyOptimizer, ZeroOptimizerStateHandler),          # (before the Optimizer it also is)
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> List[Tuple[Type, Type[StateHandler]]]:
    return _handler_registry


def set_handler_registry(registry: List[Tuple[Type, Type[StateHandler]]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _get_handlers(kwargs: Dict[str, Any]) -> Tuple[Dict[str, StateHandler], Dict[str, Any]]:
    handlers, remainder = {}, {}
    for key, value in kwargs.items():
        handler_cls = next((cls for kind, cls in _handler_registry if isinstance(value, kind)), None)
        if handler_cls is not None:
            handlers[key] = handler_cls(value)
        else:
            remainder[key] = value
    return handlers, remainder
