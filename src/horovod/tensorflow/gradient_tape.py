"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient`` averages the gradients across ranks."""
from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.types import Adasum, Average, ReduceOp
from horovod.common.util import split_list
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.mpi_ops import _grouped_allreduce, size


def _make_allreduce_grads_fn(name: str, compression, sparse_as_dense: bool, op: ReduceOp,
                             gradient_predivide_factor: float, groups, process_set: ProcessSet):
    """grads (and their variables) -> reduced grads. Dense grads of one group go out as one grouped allreduce
    (one fused exchange, and one Python callback inside tf.function); IndexedSlices go as two allgathers."""
    from horovod.tensorflow import allreduce  # the public one (handles IndexedSlices and compression)

    op = ReduceOp(op)
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction is not available in this release yet; use op=Average or Sum.")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
    postscale = gradient_predivide_factor if op == Average else 1.0

    def reduce_grads(grads: List, variables: Optional[List]) -> List:
        grads = list(grads)
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if size() == 1:        # as upstream's tf.cond(size > 1, ...): nothing to exchange
            return grads
        out = list(grads)
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = allreduce(g, op=op, name=f"{name}.sparse.{i}", process_set=process_set)
        if isinstance(groups, int) and groups > 0:
            parts = [p for p in split_list(dense, min(groups, len(dense)) or 1) if p]
        elif isinstance(groups, list) and variables is not None:
            refs = {v.ref(): gi for gi, group in enumerate(groups) for v in group}
            member = {}
            for i in dense:
                member.setdefault(refs.get(variables[i].ref(), -1 - i), []).append(i)
            parts = list(member.values())
        else:
            parts = [dense] if dense else []
        for p, indices in enumerate(parts):
            compressed = [compression.compress(grads[i]) for i in indices]
            reduced = _grouped_allreduce([c for c, _ in compressed], name=f"{name}.group{p}", op=op,
                                         prescale_factor=prescale, postscale_factor=postscale,
                                         ignore_name_scope=True, process_set=process_set)
            for i, r, (_, ctx) in zip(indices, reduced, compressed):
                out[i] = compression.decompress(r, ctx)
        return out

    return reduce_grads


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                 persistent=False, watch_accessed_variables=True, process_set=global_process_set):
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._hvd_process_set = process_set
        self._allreduce_grads = _make_allreduce_grads_fn("DistributedGradientTape", compression, sparse_as_dense,
                                                         op, gradient_predivide_factor, groups, process_set)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        gradients = super(self.__class__, self).gradient(target, sources, output_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        reduced = self._allreduce_grads(flat, flat_sources if len(flat_sources) == len(flat) else None)
        return tf.nest.pack_sequence_as(gradients, reduced)


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "", compression=Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                            process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True):
    """Wrap ``gradtape`` so that ``gradient(target, sources)`` returns gradients reduced across ranks (Average).

    ``groups``: an int (split the gradients into that many grouped allreduces) or a list of lists of variables;
    by default all dense gradients go as one group. ``num_groups`` is the deprecated form of an int ``groups``.
    """
    if num_groups and groups is None:
        groups = num_groups
    if groups is not None and not (isinstance(groups, int) or isinstance(groups, list)):
        raise ValueError("groups should be an int or a list of lists of tf.Variable")
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
               gradtape._persistent, gradtape._watch_accessed_variables, process_set)
