"""The device planes of one engine: made at the first device collective of its process set (every rank runs that
response at the same point, so the window handles can be exchanged on the host plane then), closed with the
engine."""
from __future__ import annotations

import logging
from typing import Dict

from horovod.backends.base import Backend
from horovod.backends.device_ipc import DevicePlane, ops_for
from horovod.common import config

log = logging.getLogger(__name__)


class DevicePlanes:
    """Device code -> :class:`DevicePlane` over the engine's ranks and host plane."""

    def __init__(self, rank: int, size: int, host: Backend) -> None:
        self.rank, self.size, self.host = rank, size, host
        self._planes: Dict[int, DevicePlane] = {}

    def get(self, device: int) -> DevicePlane:
        """The plane of ``device`` (a collective call: every rank of the set must make it at the same point)."""
        plane = self._planes.get(device)
        if plane is None:
            plane = self._planes[device] = DevicePlane(self.rank, self.size, self.host, ops_for(device),
                                                       config.get("HOROVOD_CUDA_IPC_WINDOW_BYTES"))
        return plane

    def close(self) -> None:
        for plane in self._planes.values():
            try:
                plane.close()
            except Exception:
                log.debug("rank %d: closing a device plane failed", self.rank, exc_info=True)
        self._planes.clear()
