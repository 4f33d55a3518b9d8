"""Run a host-side collective on JAX arrays, eagerly or from inside a traced program.

Eagerly, the arrays are handed to the host function as numpy views and its numpy results come back as JAX
arrays. Under ``jax.jit`` (any trace), the call is staged as ``jax.experimental.io_callback(..., ordered=True)``:
ordered callbacks run in program order, so every rank that runs the same program issues its collectives in the
same order, and the callback is never removed as dead code or merged with another. Its result shapes must be
known when the program is traced; the caller declares them.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import jax
import numpy as np
from jax.experimental import io_callback

from horovod.jax.arrays import is_traced, to_jax, to_numpy, tracing

__all__ = ["call_on_host"]

HostFn = Callable[..., Sequence[np.ndarray]]


def call_on_host(fn: HostFn, arrays: Sequence[Any], results: Sequence[jax.ShapeDtypeStruct]) -> List[jax.Array]:
    """``fn(*numpy_arrays)`` -> a list of numpy arrays shaped as ``results``; returned as JAX arrays.

    ``fn`` must raise a ValueError naming the problem when what it got does not fit ``results`` (under jit the
    shapes are fixed; a rank whose peers disagree must fail with a message, not with XLA's).
    """
    arrays = list(arrays)
    results = list(results)
    if not (is_traced(*arrays) if arrays else tracing()):
        return [to_jax(r) for r in fn(*[to_numpy(a) for a in arrays])]

    def host(*host_arrays):
        out = list(fn(*[to_numpy(a) for a in host_arrays]))
        return [_fit(o, spec) for o, spec in zip(out, results)]

    if not results:
        io_callback(lambda *a: (host(*a), None)[1], None, *arrays, ordered=True)
        return []
    return list(io_callback(host, results, *arrays, ordered=True))


def _fit(out: np.ndarray, spec: jax.ShapeDtypeStruct) -> np.ndarray:
    """``out`` as the declared result (same dtype), or a ValueError when its shape differs."""
    if tuple(out.shape) != tuple(spec.shape):
        raise ValueError(f"a Horovod collective inside jax.jit returned shape {tuple(out.shape)} where "
                         f"{tuple(spec.shape)} was traced; under jit every rank must pass the shapes the trace "
                         "assumed (call the collective outside jit for shapes that differ between ranks).")
    return np.asarray(out, dtype=spec.dtype)
