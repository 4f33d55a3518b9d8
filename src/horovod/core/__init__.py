"""The core: what sits above the data planes and below the framework bindings.

- :mod:`horovod.core.basics` and :mod:`horovod.core.ops` are the op layer: ``init``/``shutdown`` and who am I
  (basics is one face of :mod:`~horovod.core.bootstrap`, :mod:`~horovod.core.process_set_registry` and
  :mod:`~horovod.core.queries`), and the framework-neutral collectives that every binding calls.
- :mod:`horovod.core.observers` watch the engine: the stall inspector, the deadlock detector, the autotuner
  and the timeline glue.
- :mod:`horovod.core.engine` is the background thread that negotiates and executes collectives.
- :mod:`horovod.core.controller` is the coordinator's bookkeeping: requests, responses, fusion, the cache.

Below them sit the data planes (:mod:`horovod.backends`) and the shared ground (:mod:`horovod.common`); the
import contract in ``pyproject.toml`` keeps the arrows pointing down.
"""
