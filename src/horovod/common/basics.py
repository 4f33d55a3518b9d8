"""Upstream's import path for the process-wide basics; the module itself is :mod:`horovod.core.basics`.

``horovod.common.basics`` *is* that module (the same object in ``sys.modules``), so a program that reads or
patches its attributes sees the real ones.
"""
import sys

from horovod.core import basics as _basics

sys.modules[__name__] = _basics
