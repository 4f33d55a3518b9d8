"""Broadcast of Gluon parameters and of Python objects (upstream's ``horovod/mxnet/functions.py``)."""
from __future__ import annotations

import types
from typing import Any, List, Optional

import mxnet as mx

from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.mxnet.mpi_ops import broadcast_, size


def broadcast_parameters(params, root_rank: int = 0, prefix: Optional[str] = None) -> None:
    """Overwrite ``params`` in place with ``root_rank``'s values: a Gluon ``ParameterDict`` (``net.collect_params()``),
    or a dict of Parameters or NDArrays (``mod.get_params()``'s dicts).

    Entries are broadcast in sorted key order, so every rank issues the same names in the same order. A Gluon
    parameter whose initialisation is still deferred (its shape is known only at the first forward pass) is
    broadcast right after it is initialised, as upstream does: every rank must then run that first forward pass.
    """
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str or None, got {type(prefix).__name__}")
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError(f"invalid params of type: {type(params).__name__}; pass net.collect_params() or a dict "
                         "of NDArrays")
    if size() == 1:
        return
    pending = []
    for name, p in sorted(params.items()):
        if isinstance(p, mx.gluon.Parameter):
            try:
                pending.append((p.data(), prefix + str(name)))
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(_broadcast_after_init(p._init_impl, root_rank, prefix + str(name)),
                                                p)
        else:
            pending.append((p, prefix + str(name)))
    for tensor, name in pending:
        broadcast_(tensor, root_rank, name=name)


def _broadcast_after_init(init_impl, root_rank: int, name: str):
    """Wrap a deferred parameter's ``_init_impl`` so that its first values come from ``root_rank``."""

    def wrapped_init_impl(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        for data in self.list_data():
            broadcast_(data, root_rank=root_rank, name=name)

    return wrapped_init_impl


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Send a picklable object from ``root_rank`` to every rank and return it."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List:
    """Gather one picklable object from every rank, as a list indexed by rank."""
    return ops.allgather_object(obj, name, process_set)
