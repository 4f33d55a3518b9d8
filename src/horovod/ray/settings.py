"""The settings of a Ray job (upstream's ``horovod.ray.runner.MiniSettings`` and the elastic settings).

``RayExecutor.create_settings(...)`` and ``ElasticRayExecutor.create_settings(...)`` build these; the executors
read them. The job secret is not part of the settings: the executor makes a fresh one for every start, hands it
to its actors through Ray, and never puts it on a command line.
"""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Tuple


@dataclasses.dataclass
class MiniSettings:
    """What a static Ray job needs: timeouts, the ssh identity (kept for upstream's signature) and the NICs."""

    nics: Optional[List[str]] = None
    verbose: int = 1
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    timeout_s: float = 300
    placement_group_timeout_s: float = 100
    elastic: bool = False

    @property
    def start_timeout(self) -> float:
        """Seconds the ranks wait for each other at ``hvd.init()`` (HOROVOD_START_TIMEOUT)."""
        return float(self.timeout_s)


@dataclasses.dataclass
class ElasticRaySettings(MiniSettings):
    """A :class:`MiniSettings` plus the bounds and failure policy of an elastic job."""

    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None
    elastic_timeout: float = 600
    elastic: bool = True


def write_identity(ssh_identity_file: Optional[str], ssh_str: Optional[str]) -> None:
    """Upstream's ``ssh_str``: the private key's text, written to ``ssh_identity_file`` when that does not exist."""
    if ssh_str is None:
        return
    if not ssh_identity_file:
        raise ValueError("create_settings(ssh_str=...) needs ssh_identity_file: the path to write the key to.")
    if not os.path.exists(ssh_identity_file):
        with open(os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(ssh_str)


def create_settings(timeout_s: float = 30, ssh_identity_file: Optional[str] = None, ssh_str: Optional[str] = None,
                    placement_group_timeout_s: float = 100, nics: Optional[List[str]] = None) -> MiniSettings:
    """The settings of :class:`horovod.ray.RayExecutor` (upstream's ``RayExecutor.create_settings``)."""
    write_identity(ssh_identity_file, ssh_str)
    return MiniSettings(nics=list(nics) if nics else None, ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                        placement_group_timeout_s=placement_group_timeout_s)
