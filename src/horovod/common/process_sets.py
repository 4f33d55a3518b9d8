"""Upstream's import path ``horovod.common.process_sets``: process sets, defined elsewhere.

:class:`ProcessSet` and ``global_process_set`` are defined in :mod:`horovod.core.process_sets`,
``add_process_set`` and ``remove_process_set`` in :mod:`horovod.core.process_set_registry` (they start and stop
the sets' engines). The same objects, re-exported.
"""
from horovod.core.process_set_registry import add_process_set, remove_process_set
from horovod.core.process_sets import ProcessSet, global_process_set

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
