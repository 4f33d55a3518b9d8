"""How ``horovod.jax`` hands JAX arrays to the op layer and back.

A ``jax.Array`` on the CPU is read through ``np.asarray``, a read-only view of its buffer (no copy): the op layer
only reads its inputs. Results come back as JAX arrays on the result's memory (DLPack) or, below ``COPY_BELOW``,
as copies (:func:`to_jax`). Inside ``jax.jit`` (or any other
JAX trace) the arrays are tracers; the collectives then run as ordered host callbacks (``host_calls``).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_traced", "tracing", "to_numpy", "to_jax", "check_array"]


def is_traced(*values: Any) -> bool:
    """True if any of ``values`` is a JAX tracer (we are inside jit, grad, vmap ...)."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def tracing() -> bool:
    """True while a JAX transformation (jit, grad ...) is tracing the caller: a fresh array is then a tracer.

    Collectives without array arguments (barrier, join) use this to decide between running now and staging a
    host callback into the traced program."""
    return isinstance(jnp.zeros((), jnp.int32), jax.core.Tracer)


def check_array(value: Any, what: str) -> jax.Array:
    """``value`` as a JAX array (numpy arrays and Python scalars are accepted and converted); ValueError with
    what to do for anything else."""
    if isinstance(value, (jax.Array, jax.core.Tracer)):
        return value
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return jnp.asarray(value)
    raise ValueError(f"{what} expects a jax.Array (or a numpy array), got {type(value).__name__}; "
                     "convert it with jnp.asarray first.")


def to_numpy(value: Any) -> np.ndarray:
    """A C-contiguous numpy array with ``value``'s data: a zero-copy, read-only view of a CPU ``jax.Array``."""
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


# Below this a result is copied into a new JAX array: ``jnp.asarray`` costs less than DLPack's import there
# (4 KB: 23 against 38 µs, 64 KB: 29 against 43; from 512 KB DLPack wins, 1 MB: 79 against 138).
COPY_BELOW = 256 << 10


def to_jax(array: np.ndarray) -> jax.Array:
    """``array`` as a JAX array: from ``COPY_BELOW`` bytes sharing its memory through DLPack where it can (the op
    layer's new outputs; a pooled one is not reused while the JAX array holds it), else copied (small arrays,
    bfloat16, read-only arrays)."""
    if (array.nbytes >= COPY_BELOW and array.flags.writeable and array.dtype.kind in "biuf"
            and array.dtype.isnative):
        try:
            return jax.dlpack.from_dlpack(array)
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass
    return jnp.asarray(array)       # the same dtype as device_put, in half its time at 4 KB


def shapes_of(values: Sequence[Any]) -> list:
    """The (shape, dtype) of each value, as ``jax.ShapeDtypeStruct``."""
    return [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in values]
