"""Upstream's import path ``horovod.tensorflow.util``: helpers that user code and upstream's tests import."""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import tensorflow as tf


def _executing_eagerly() -> bool:
    """True when ops run eagerly (False while tracing a tf.function or building a TF1 graph)."""
    return tf.executing_eagerly()


def _make_subgraph(f: Callable) -> Callable:
    """``f`` as a ``tf.function``, so that eagerly its ops run as one graph."""
    return tf.function(f)


def _cache(f: Callable) -> Callable:
    """Memoize ``f`` on its (hashable) arguments and on whether it is called eagerly."""
    cache: Dict[Tuple[Any, bool], Any] = {}

    def wrapper(*args):
        key = (args, _executing_eagerly())
        if key not in cache:
            cache[key] = f(*args)
        return cache[key]

    return wrapper


def vars_to_refs(variables):
    """A (nested) list of variables as a hashable tuple of their ``ref()``s."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The inverse of :func:`vars_to_refs`."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
