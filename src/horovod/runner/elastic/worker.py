"""Upstream's module path for the worker side of elastic notifications: the objects live in
:mod:`horovod.common.elastic` (the shared ground, which the library's bindings use without the runner)."""
from horovod.common.elastic import HostUpdateResult, WorkerNotificationManager, notification_manager

__all__ = ["HostUpdateResult", "WorkerNotificationManager", "notification_manager"]
