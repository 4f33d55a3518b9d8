"""Exceptions that Horovod users catch, with upstream's names and base classes."""
from __future__ import annotations

import re


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank or on a peer (mismatch, dead peer, shutdown).

    Elastic training catches it to restore state and re-rendezvous.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Raised in elastic mode when hosts were added or removed.

    ``skip_sync`` tells the elastic loop whether state must be re-synchronised.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("Hosts were updated; re-rendezvous is required.")
        self.skip_sync = skip_sync


class HorovodVersionMismatchError(ImportError):
    """A framework binding was imported against an incompatible framework version."""

    def __init__(self, name: str, version: str, installed_version: str) -> None:
        super().__init__(
            f"Framework {name} installed with version {installed_version} but found version {version}. "
            "Reinstall the matching version or upgrade horovod."
        )
        self.name = name
        self.version = version
        self.installed_version = installed_version


NOT_INITIALIZED_MESSAGE = "Horovod has not been initialized; use hvd.init()."

SHUT_DOWN_MESSAGE = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
    "was caused by an exception, you should see the exception in the log before the first shutdown message."
)


def not_initialized() -> ValueError:
    """The upstream error for any use of Horovod before ``hvd.init()``."""
    return ValueError(NOT_INITIALIZED_MESSAGE)


# What the coordinator reports when the ranks' requests for a tensor disagree (horovod/core/controller/coordinator.py).
_NEGOTIATION = re.compile(r"Mismatched |Invalid root rank |Cannot REDUCESCATTER |Rank\(s\) [\d, ]+ tried to "
                          r"|\w+ is not supported with Join")


def is_negotiation_error(exc: BaseException) -> bool:
    """True for the coordinator's verdict that the ranks disagree about a tensor: a HorovodInternalError, as
    upstream, but a mistake of the program rather than a failure of the job, which no reset can fix."""
    return isinstance(exc, HorovodInternalError) and bool(_NEGOTIATION.match(str(exc)))
