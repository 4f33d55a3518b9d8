"""Upstream's import path ``horovod.common.basics``: the op layer's basics, :mod:`horovod.core.basics`.

``horovod.common.basics`` *is* that module (the same object in ``sys.modules``), so a program reads the real
names; the code lives in :mod:`horovod.core.bootstrap`, :mod:`horovod.core.process_set_registry` and
:mod:`horovod.core.queries`.
"""
import sys

from horovod.core import basics as _basics

sys.modules[__name__] = _basics
