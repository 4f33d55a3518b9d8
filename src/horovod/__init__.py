"""Horovod, written in Python: distributed data-parallel training with Horovod's API and no compiler.

Import a framework binding (``horovod.torch``, ``horovod.tensorflow``, ``horovod.numpy`` ...) and launch with
``horovodrun -np N python train.py``. ``horovod.run(fn, np=N)`` runs a function on N ranks from Python.
"""
from __future__ import annotations

from horovod.version import __version__  # noqa: F401


def __getattr__(name):
    if name == "run":
        from horovod.runner import run

        return run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")
