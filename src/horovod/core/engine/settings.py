"""The engine's settings: one object instead of a constructor with a dozen knobs."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

from horovod.common import config


def _same(nbytes: int) -> int:
    return nbytes


def confirm_seconds() -> float:
    """How long a deadlock must hold before it is reported (HOROVOD_DEADLOCK_CHECK_TIME_SECONDS, at most the
    stall inspector's warning time)."""
    return max(0.0, min(config.get("HOROVOD_DEADLOCK_CHECK_TIME_SECONDS"),
                        config.get("HOROVOD_STALL_CHECK_TIME_SECONDS")))


def lapse_seconds() -> float:
    """How long a rank whose timed wait ran out still counts as waiting (absorbs polling with short timed waits);
    kept well inside the deadlock detector's confirmation window."""
    return max(0.01, min(0.5, confirm_seconds() / 4))


@dataclasses.dataclass
class EngineSettings:
    """What one engine runs with. The tunables (cycle time, fusion threshold, cache) start here; the autotuner
    changes them on every rank at the same point of the response stream (see ``Engine.set_params``)."""

    cache_capacity: int = 1024
    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time_ms: float = 1.0
    disable_group_fusion: bool = False
    spin_us: float = 0.0                     # poll this long after activity before sleeping in the kernel
    affinity: Optional[int] = None           # the core the engine thread is pinned to
    bucket_bytes: int = 0                    # hold ready tensors nobody waits on until this many bytes ...
    bucket_ms: float = 0.0                   # ... or this long
    align_threshold: Callable[[int], int] = _same     # a fusion threshold the autotuner proposes, made usable
    wait_lapse_s: float = dataclasses.field(default_factory=lapse_seconds)
    hosts: Optional[List[str]] = None        # each rank's host, for error messages
    fast_rounds: bool = True                 # small blocking allreduces may skip the coordinator (fast_rounds.py)
    flight_recorder_size: int = 2000         # collectives the flight record keeps (flight.py); 0: none
    coordinator_carry_bytes: int = 32 * 1024     # a small blocking collective's bytes from rank 0 (carried.py)

    def hold_seconds(self) -> float:
        """How long the coordinator may hold a ready tensor nobody waits on: the cycle time or the bucket window."""
        return max(max(0.0, self.cycle_time_ms) / 1000.0, self.bucket_ms / 1000.0 if self.bucket_bytes > 0 else 0.0)
