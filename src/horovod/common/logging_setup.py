"""Horovod's log records: level from HOROVOD_LOG_LEVEL, every record tagged with the rank.

Every module logs through ``logging.getLogger(__name__)``, a child of the ``horovod`` logger configured here.
Four loggers are named channels instead, each shared by several modules, because a program, a test or the
launcher selects them by name (each such line says "a named channel"):

- ``horovod.stall``: stall warnings, the deadlock watchdog and heartbeats (core/observers, core/engine);
- ``horovod.elastic``: an elastic job's rounds, on the driver and on the workers (``horovodrun`` shows it at INFO
  without ``--verbose``);
- ``horovod.torch``: ``horovod.torch``'s optimizer and unused-parameter notices (docs/torch.md);
- ``horovod.spark``: the Spark integration (docs/spark.md, ``verbose``).
"""
from __future__ import annotations

import logging

from horovod.common import config

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL}


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.hvd_rank = self.rank
        return True


def configure(rank: int) -> None:
    """Attach one handler to the ``horovod`` logger (idempotent), honouring the log knobs."""
    logger = logging.getLogger("horovod")
    level_name = config.get("HOROVOD_LOG_LEVEL")
    if level_name not in _LEVELS:
        raise ValueError(f"HOROVOD_LOG_LEVEL={level_name!r}: choose one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL.")
    logger.setLevel(_LEVELS[level_name])
    for handler in list(logger.handlers):
        if getattr(handler, "_horovod", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler()
    handler._horovod = True  # type: ignore[attr-defined]
    stamp = "" if config.get("HOROVOD_LOG_HIDE_TIME") else "[%(asctime)s] "
    handler.setFormatter(logging.Formatter(f"{stamp}[horovod %(levelname)s rank %(hvd_rank)s] %(message)s"))
    handler.addFilter(_RankFilter(rank))
    logger.addHandler(handler)
    logger.propagate = False
