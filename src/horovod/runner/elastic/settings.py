"""The settings of an elastic launch (upstream's ``horovod.runner.elastic.settings.ElasticSettings``)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from horovod.runner.common.util.settings import Settings

from .discovery import HostDiscovery


@dataclasses.dataclass
class ElasticSettings(Settings):
    """A static launch's settings plus how to find hosts, the bounds on the job's size and the failure policy.

    ``num_proc`` is the size the job waits for before it starts; ``min_num_proc`` the size below which it stops
    training and waits for hosts (up to ``elastic_timeout`` seconds); ``max_num_proc`` caps the size.
    """

    discovery: Optional[HostDiscovery] = None
    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    elastic_timeout: Optional[float] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None

    @property
    def elastic(self) -> bool:
        return True
