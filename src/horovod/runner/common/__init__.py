"""Launcher internals shared by ``horovodrun`` and ``horovod.run`` (upstream's ``horovod.runner.common``)."""
