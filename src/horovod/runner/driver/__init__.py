"""Upstream's import path ``horovod.runner.driver``: the package of :mod:`.driver_service`."""
