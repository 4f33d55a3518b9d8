"""The ``tf.errors`` a Horovod failure is raised as, with upstream's status codes.

Upstream's TF kernels fail with ``FailedPreconditionError`` when the ranks disagree about a collective (shape,
dtype, root rank, op...: what the coordinator finds while negotiating), ``InvalidArgumentError`` for arguments one
rank can reject alone (alltoall splits, a scalar to reducescatter, a root rank outside the job), ``AbortedError``
for a reducescatter op other than Sum and Average, and ``UnknownError`` when the job failed (shut down, a peer
lost). The op layer raises ValueError and HorovodInternalError; here they become those ``tf.errors`` classes.

Each class raised also keeps the op layer's type (``InvalidArgumentError`` is a ValueError; the negotiation and job
failures are HorovodInternalErrors), so code that catches either kind keeps working. They take TensorFlow's
arguments ``(node_def, op, message)``, so that autograph can re-raise them from a traced function unchanged; build
them with :func:`make`.
"""
from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from horovod.common.exceptions import (
    NOT_INITIALIZED_MESSAGE,
    HorovodInternalError,
    is_negotiation_error,
)


class FailedPreconditionError(tf.errors.FailedPreconditionError, HorovodInternalError):
    """The ranks disagree about a collective (upstream's precondition error); also a HorovodInternalError."""


class InvalidArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """An argument this rank can reject alone; also a ValueError."""


class AbortedError(tf.errors.AbortedError, ValueError):
    """Upstream's status for a reduction a collective does not support; also a ValueError."""


class UnimplementedError(tf.errors.UnimplementedError, NotImplementedError):
    """A feature this release does not have; also a NotImplementedError."""


class NotInitializedError(tf.errors.FailedPreconditionError, ValueError):
    """A collective before ``hvd.init()`` (upstream's precondition error); also the ValueError of the basics."""


class UnknownError(tf.errors.UnknownError, HorovodInternalError):
    """The job failed (shut down, a peer lost, a data-plane error); also a HorovodInternalError."""


def make(cls, message: str) -> tf.errors.OpError:
    """An instance of one of these classes (or of a ``tf.errors`` class) with ``message``."""
    return cls(None, None, message)


def translate(exc: BaseException) -> BaseException:
    """The exception to raise for ``exc``: a ``tf.errors`` class with upstream's code (``exc`` itself when it is
    one already, or not a Horovod failure)."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    message = str(exc)
    if isinstance(exc, HorovodInternalError):
        return make(FailedPreconditionError if is_negotiation_error(exc) else UnknownError, message)
    if isinstance(exc, ValueError):
        return make(NotInitializedError if message == NOT_INITIALIZED_MESSAGE else InvalidArgumentError, message)
    if isinstance(exc, NotImplementedError):
        return make(UnimplementedError, message)
    return exc


def status_of(exc: BaseException) -> Tuple[int, str]:
    """The TF status (code, message) a kernel fails with for ``exc``."""
    translated = translate(exc)
    if isinstance(translated, tf.errors.OpError):
        return translated.error_code, translated.message
    if isinstance(exc, TypeError):
        return tf.errors.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, MemoryError):
        return tf.errors.RESOURCE_EXHAUSTED, str(exc) or "out of memory"
    return tf.errors.UNKNOWN, f"{type(exc).__name__}: {exc}"
