"""The settings of one static launch (upstream's ``horovod.runner.common.util.settings.Settings``)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional


@dataclasses.dataclass
class Settings:
    """What the launcher needs to start the ranks of one job."""

    num_proc: int
    hosts: str
    verbose: int = 0
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    extra_mpi_args: Optional[str] = None
    tcp_flag: bool = False
    binding_args: Optional[str] = None
    start_timeout: float = 30.0
    output_filename: Optional[str] = None
    run_func: bool = False
    nics: Optional[List[str]] = None
    prefix_output_with_timestamp: bool = False
    monitor_port: Optional[int] = None          # the live page's port (0: a free one); None: no page
    monitor_address: str = "127.0.0.1"

    @property
    def elastic(self) -> bool:
        """False: a static launch (``ElasticSettings`` says True)."""
        return False
