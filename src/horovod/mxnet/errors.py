"""Errors of ``horovod.mxnet`` in upstream's types.

Upstream runs each collective as an operator on MXNet's engine, so its failures reach the program as
``mxnet.base.MXNetError`` (a RuntimeError). Ours are raised by the op layer as ValueError (an argument one rank can
check alone: an unsupported dtype, a duplicate in-flight name) or HorovodInternalError (the ranks disagree on a
shape or a dtype, a peer failed). Each is re-raised as a class that is both: ``except MXNetError``, as upstream's
programs and tests write it, and ``except ValueError`` / ``except HorovodInternalError``, as the other bindings'
programs write it, both catch it.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Type

from mxnet.base import MXNetError

_combined: Dict[type, Type[Exception]] = {}


def as_mxnet_error(error: Exception) -> Exception:
    """``error`` as an exception that is also an MXNetError (the same message, the original as its cause)."""
    if isinstance(error, MXNetError):
        return error
    cls = type(error)
    combined = _combined.get(cls)
    if combined is None:
        # Pickled (to another process), it becomes the original class again: the combined one has no import path.
        combined = _combined[cls] = type(cls.__name__, (cls, MXNetError), {
            "__module__": cls.__module__, "__reduce__": lambda self, cls=cls: (cls, self.args)})
    try:
        converted = combined(*error.args)
    except TypeError:           # an exception whose __init__ takes other arguments: keep it as it is
        return error
    converted.__cause__ = error
    return converted


@contextlib.contextmanager
def mxnet_errors() -> Iterator[None]:
    """Re-raise the ValueErrors and RuntimeErrors of a collective as MXNetErrors too (see the module's doc)."""
    try:
        yield
    except (ValueError, RuntimeError) as error:
        converted = as_mxnet_error(error)
        if converted is error:
            raise
        raise converted from error
