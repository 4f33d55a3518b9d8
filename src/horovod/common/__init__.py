"""The shared ground every layer stands on: typed knobs (``config``), exceptions, types, the authenticated wire,
the kvstore, topology detection, logging, elastic notifications; plus upstream's public paths (``basics``,
``process_sets``, ``util``) as thin faces of what lives in ``horovod.core``. The op layer, the engine and the
controller are in ``horovod.core``; the data planes in ``horovod.backends`` (docs/architecture.md)."""
