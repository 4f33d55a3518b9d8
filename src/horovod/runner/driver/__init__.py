"""Upstream's package ``horovod.runner.driver`` (see :mod:`.driver_service`)."""
