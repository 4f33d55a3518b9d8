"""Upstream's import path ``horovod.runner.common.util.codec``: objects as base64 text of their cloudpickle.

Upstream passes settings and functions to its task services this way. Here the launcher ships functions through
the authenticated rendezvous store (:mod:`horovod.runner.run_func`) with cloudpickle too; these two helpers keep
upstream's names and encoding for code that calls them. Decode only what came from a peer that proved it holds
the job's secret: unpickling runs code.
"""
from __future__ import annotations

import base64
import pickle
from typing import Any, Union


def dumps_base64(obj: Any, to_ascii: bool = True) -> Union[str, bytes]:
    """``obj`` cloudpickled and base64-encoded: a str when ``to_ascii`` (the default), else bytes."""
    import cloudpickle

    encoded = base64.b64encode(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return encoded.decode("ascii") if to_ascii else encoded


def loads_base64(encoded: Union[str, bytes]) -> Any:
    """The object that :func:`dumps_base64` encoded (str or bytes)."""
    import cloudpickle

    return cloudpickle.loads(base64.b64decode(encoded))
