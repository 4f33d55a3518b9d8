"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient`` averages the gradients across ranks, and
``PartialDistributedGradientTape``, which leaves the gradients of some (local) layers out of the allreduce.

Local gradients: a variable registered with ``register_local_source`` keeps this rank's own gradient. With
``scale_local_gradients=True`` (the default, as upstream since 0.28) that gradient is divided by the number of
ranks, so that local and global variables see the gradient of one objective, the mean of the ranks' losses:
``d mean_r(L_r) / d w_local = (1/size) * dL_local / d w_local``, while the allreduce (Average) gives exactly that
mean for the global variables.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from horovod.common import config
from horovod.common.compression import PowerSGDCompressor, check_powersgd_op
from horovod.common.gradient_groups import allreduce_in_groups, check_groups, scale_factors
from horovod.common.gradient_presence import label
from horovod.common.types import Adasum, Average, ReduceOp, Sum
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.tensorflow import overlap
from horovod.tensorflow import powersgd as _powersgd
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.mpi_ops import _grouped_allreduce, _set_size, collective_chain
from horovod.tensorflow.none_gradients import TAPE_REMEDY, check_node, grouped_allreduce_checked, host_check


def _key(source):
    """A hashable identity for a variable or tensor: its ``ref()``; a Keras 3 variable (unhashable, no ``ref``)
    is keyed by the ``tf.Variable`` it wraps, so either form identifies it."""
    inner = getattr(source, "value", None)
    if isinstance(inner, tf.Variable):
        source = inner
    return source.ref() if hasattr(source, "ref") else id(source)


def _make_allreduce_grads_fn(name: str, compression, sparse_as_dense: bool, op: ReduceOp,
                             gradient_predivide_factor: float, groups, process_set: ProcessSet,
                             remedy: str = TAPE_REMEDY, powersgd_state: Optional[_powersgd.PowerSGDState] = None):
    """grads (and their variables) -> reduced grads. Dense grads of one group go out as one grouped allreduce
    (one fused exchange; with HOROVOD_TF_OVERLAP_BYTES, inside a tf.function, large ones start alone as soon as
    they exist, see ``overlap``); IndexedSlices go as two allgathers, after them. First the ranks check that
    the same gradients are None everywhere (``none_gradients``; ``remedy`` ends its error).

    With ``compression=Compression.powersgd(...)`` the dense gradients go through ``horovod.tensorflow.powersgd``
    with ``powersgd_state`` (an optimizer's own), or by default the process-wide state of ``name`` and the
    process set (a tape is made anew every step); Adasum and sparse gradients (without ``sparse_as_dense``) are
    refused."""
    from horovod.tensorflow import allreduce  # the public one (handles IndexedSlices and compression)

    op = ReduceOp(op)
    check_powersgd_op(compression, op)
    prescale, postscale = scale_factors(op, gradient_predivide_factor)
    powersgd = isinstance(compression, PowerSGDCompressor)
    if powersgd and powersgd_state is None:
        powersgd_state = _powersgd.shared_state(compression, name, process_set.ranks or ())

    def reduce_grads(grads: List, variables: Optional[List]) -> List:
        grads = list(grads)
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        elif powersgd:
            for i, g in enumerate(grads):
                if isinstance(g, tf.IndexedSlices):
                    raise _powersgd.refuse_sparse(label(None if variables is None else variables[i], i))
        # As upstream's _allreduce_cond: nothing to exchange in a set of one rank, and a rank outside the set
        # keeps its own gradients. Not in an elastic job (as torch's optimizer): a tf.function traced at size 1
        # keeps its graph after the job grows, and would never allreduce again.
        if not process_set.included() or (_set_size(process_set) == 1 and not config.get("HOROVOD_ELASTIC")):
            return grads
        # In a graph, a graph-unique prefix (the same on every rank that builds the same graph) keeps two
        # optimizers of one graph from submitting the same tensor names at once.
        base = name if tf.executing_eagerly() else tf.compat.v1.get_default_graph().unique_name(name)
        with collective_chain():   # a TF1 graph: this step's collectives run in one order on every rank
            return _reduce(grads, variables, base)

    def _grouped(tensors: List, group_name: str) -> List:
        return _grouped_allreduce(tensors, name=group_name, op=op, prescale_factor=prescale,
                                  postscale_factor=postscale, ignore_name_scope=True, process_set=process_set)

    def _reduce(grads: List, variables: Optional[List], base: str) -> List:
        out = list(grads)
        # Before any gradient collective, the ranks check that the same gradients are None everywhere
        # (``none_gradients``): inside the first dense group's node, or in a node of its own. Not with the early
        # starts of HOROVOD_TF_OVERLAP_BYTES, which must depend on their gradient alone (see none_gradients).
        check = host_check(grads, variables, base, process_set, who=name, remedy=remedy)
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        if powersgd and dense:
            check_node(check)    # its own node: the collectives below are in one of two tf.cond branches
            _powersgd_reduce(out, dense, variables, base)
        elif not groups and op != Adasum and overlap.usable():   # HOROVOD_TF_OVERLAP_BYTES set
            if dense:
                _as_ready(out, dense, base)
        elif dense:
            carrier = [check]

            def grouped(tensors: List, group_name: str) -> List:
                if carrier:
                    return grouped_allreduce_checked(tensors, group_name, op, prescale, postscale, process_set,
                                                     carrier.pop())
                return _grouped(tensors, group_name)

            allreduce_in_groups(out, dense, variables, groups, compression, grouped, base, key=_key)
        else:
            check_node(check)
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = allreduce(g, op=op, name=f"{base}.sparse.{i}", ignore_name_scope=True,
                                   process_set=process_set)
        return out

    def _powersgd_reduce(out: List, dense: List[int], variables: Optional[List], base: str) -> None:
        """The dense gradients ``out[i]`` (``i`` in ``dense``) reduced by PowerSGD (``groups`` apply to those it
        does not compress)."""
        def plain(tensors: List, positions: List[int]) -> List:
            tensors = list(tensors)
            allreduce_in_groups(tensors, positions, None if variables is None else [variables[i] for i in dense],
                                groups, Compression.none, _grouped, base, key=_key)
            return tensors

        def summed(tensors: List, group_name: str) -> List:
            return _grouped_allreduce(tensors, name=group_name, op=Sum, ignore_name_scope=True,
                                      process_set=process_set)

        keys = [_key(variables[i]) if variables is not None else (i, tuple(out[i].shape.as_list())) for i in dense]
        reduced = powersgd_state.reduce([out[i] for i in dense], keys, plain, _grouped, summed, base)
        for i, r in zip(dense, reduced):
            out[i] = r

    def _as_ready(out: List, dense: List[int], base: str) -> None:
        """Without groups, in a tf.function, with HOROVOD_TF_OVERLAP_BYTES set: each large dense gradient its
        own allreduce (the small ones one group), started as soon as it exists, while TensorFlow still computes
        the others (``overlap``)."""
        compressed = [compression.compress(out[i]) for i in dense]
        tensors = [c for c, _ in compressed]
        nbytes = [t.shape.num_elements() * t.dtype.size if t.shape.is_fully_defined() else 0 for t in tensors]
        reduced = overlap.allreduce_as_ready(tensors, [f"{base}.{i}" for i in dense], op, prescale, postscale,
                                             process_set, overlap.plan(nbytes, overlap.ALONE_BYTES))
        for i, r, (_, ctx) in zip(dense, reduced, compressed):
            out[i] = compression.decompress(r, ctx)

    return reduce_grads


def _scale_local(grad, divisor: int):
    """``grad / divisor`` as upstream (``tf.cast(1 / size, dtype)`` would round the factor through float32)."""
    if grad is None or divisor == 1:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / divisor, grad.indices, grad.dense_shape)
    return grad / divisor


def reduce_global_keep_local(allreduce_grads: Callable[[List, Optional[List]], List], grads: Sequence,
                             sources: Optional[Sequence], local_keys: set, scale_local_gradients: bool,
                             process_set: ProcessSet) -> List:
    """The gradients to apply: ``allreduce_grads`` of the global sources' gradients, and this rank's own gradient
    for the sources whose key is in ``local_keys`` (divided by the number of ranks of ``process_set``, over which
    the global ones are averaged, when ``scale_local_gradients``; see the module docstring)."""
    grads = list(grads)
    if not local_keys or sources is None:
        return allreduce_grads(grads, None if sources is None else list(sources))
    sources = list(sources)
    local = [_key(s) in local_keys for s in sources]
    global_idx = [i for i, is_local in enumerate(local) if not is_local]
    out = list(grads)
    if global_idx:
        reduced = allreduce_grads([grads[i] for i in global_idx], [sources[i] for i in global_idx])
        for i, r in zip(global_idx, reduced):
            out[i] = r
    divisor = _set_size(process_set) if scale_local_gradients and process_set.included() else 1
    for i, is_local in enumerate(local):
        if is_local:
            out[i] = _scale_local(grads[i], divisor)
    return out


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                 persistent=False, watch_accessed_variables=True, process_set=global_process_set,
                 scale_local_gradients=True):
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._hvd_process_set = process_set
        self._local_sources = set()
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._allreduce_grads = _make_allreduce_grads_fn("DistributedGradientTape", compression, sparse_as_dense,
                                                         op, gradient_predivide_factor, groups, process_set)

    def register_local_source(self, source):
        """Mark ``source`` (a variable) as local to this rank: its gradient is not allreduced; ``gradient``
        returns this rank's own (scaled by 1/size when ``scale_local_gradients``)."""
        self._local_sources.add(_key(source))

    def _reduce(self, gradients, sources):
        """From this rank's ``gradients`` of ``sources`` (as the plain tape computed them), the gradients to
        apply: allreduced for global sources, this rank's own for the registered local ones."""
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        aligned = flat_sources if len(flat_sources) == len(flat) else None
        reduced = reduce_global_keep_local(self._allreduce_grads, flat, aligned, self._local_sources,
                                           self.scale_local_gradients, self.process_set)
        return tf.nest.pack_sequence_as(gradients, reduced)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The gradients of ``target`` with respect to ``sources``, averaged across ranks. A source the target
        does not depend on gets None (on every rank alike, or every rank raises ``NoneGradientError`` naming it),
        or zeros with ``unconnected_gradients=tf.UnconnectedGradients.ZERO`` (as ``tf.GradientTape``)."""
        gradients = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                         unconnected_gradients=unconnected_gradients)
        return self._reduce(gradients, sources)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False,
                                       unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Upstream's split view of :meth:`gradient`: ``(local_vars_grads, global_vars_grads)``, two lists of
        ``(source, gradient)`` pairs in the order of ``sources``: the registered local sources with this rank's
        own gradient (scaled as in ``gradient``), and the others with the reduced one."""
        gradients = self.gradient(target, sources, output_gradients, use_generic_names, unconnected_gradients)
        local_pairs, global_pairs = [], []
        for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(gradients, expand_composites=False)):
            (local_pairs if _key(source) in self._local_sources else global_pairs).append((source, grad))
        return local_pairs, global_pairs


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "", compression=Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                            process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True):
    """Wrap ``gradtape`` so that ``gradient(target, sources)`` returns gradients reduced across ranks (Average).

    ``groups``: an int (split the gradients into that many grouped allreduces) or a list of lists of variables;
    by default all dense gradients go as one group. With ``HOROVOD_TF_OVERLAP_BYTES`` set and no ``groups``,
    inside a ``tf.function`` each gradient of at least that many bytes is its own allreduce, started as soon as
    TensorFlow has computed it (``horovod.tensorflow.overlap``). ``num_groups`` is the deprecated form of an int
    ``groups``.
    Variables registered with ``register_local_source`` keep their local gradient, divided by the number of ranks
    when ``scale_local_gradients``.
    """
    groups = check_groups(groups, num_groups)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
               gradtape._persistent, gradtape._watch_accessed_variables, process_set, scale_local_gradients)


def _layer_types() -> tuple:
    """The Keras layer classes in use: Keras 3's, and tf-keras's (Keras 2, ``tf.keras`` under
    TF_USE_LEGACY_KERAS=1) when it is loaded."""
    import sys

    import keras

    types = [keras.layers.Layer]
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        types.append(tf_keras.layers.Layer)
    return tuple(types)


def PartialDistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "",
                                   compression=Compression.none, sparse_as_dense: bool = False,
                                   op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups=None, process_set: ProcessSet = global_process_set,
                                   local_layers=None, scale_local_gradients: bool = True):
    """A ``DistributedGradientTape`` that does not allreduce the gradients of the variables of ``local_layers``
    (a Keras layer or a list of them): those layers stay different on each rank (model parallelism, per-rank
    heads). Their gradients are this rank's own, divided by the number of ranks when ``scale_local_gradients``.
    """
    layer_types = _layer_types()
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, layer_types):
        local_layers = [local_layers]
    else:
        local_layers = list(local_layers)
    wrong = [type(layer).__name__ for layer in local_layers if not isinstance(layer, layer_types)]
    if wrong:
        raise ValueError(f"All local layers must be of tf.keras.layers.Layer type; got {', '.join(wrong)}. "
                         "Pass the layers themselves (e.g. local_layers=[model.layers[0]]).")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
