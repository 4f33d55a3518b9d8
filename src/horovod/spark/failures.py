"""Turning the ranks' exit records into the error a user of ``horovod.spark.run`` sees: the first rank that
failed for a reason of its own (not a peer's failure), where it ran, and its traceback or last output lines."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from horovod.common import wire
from horovod.runner import run_func
from horovod.runner.output_tail import report_lines
from horovod.runner.process import describe_returncode

from . import protocol


class HorovodSparkError(RuntimeError):
    """A rank of a Spark job failed; the job was stopped. ``rank``, ``executor`` and ``host`` say where, the
    message says why (the function's traceback, or how the process ended and its last lines), and ``__cause__``
    is the function's exception where it could be sent back."""

    def __init__(self, message: str, rank: int, place: protocol.TaskPlace) -> None:
        super().__init__(message)
        self.rank = rank
        self.executor = place.executor
        self.host = place.host


def _is_consequence(result: Optional[dict]) -> bool:
    """True when the rank's function failed because a peer did (the engine reports that as a
    HorovodInternalError), so another rank holds the root cause."""
    if result is None:
        return False
    from horovod.common.exceptions import HorovodInternalError

    exc = result.get("exception")
    return isinstance(exc, HorovodInternalError) or str(result.get("repr", "")).startswith("HorovodInternalError")


def failed_ranks(store) -> Dict[int, dict]:
    """The exit records of the ranks that ended with a non-zero status, by rank."""
    records = {key: wire.unpack(value) for key, value in store.items(protocol.EXIT_SCOPE).items()}
    return {int(key): record for key, record in records.items() if record["returncode"] != 0}


def _result(store, rank: int) -> Optional[dict]:
    payload = store.get(run_func.RESULT_SCOPE, str(rank))
    return run_func.decode(payload) if payload is not None else None


def lost_ranks(store) -> Dict[int, protocol.TaskPlace]:
    """The ranks whose task started but never recorded how the rank ended: lost with their task or executor."""
    ended = store.items(protocol.EXIT_SCOPE)
    lost = {}
    for value in store.items(protocol.TASKS_SCOPE).values():
        record = wire.unpack(value)
        if "rank" in record and str(record["rank"]) not in ended:
            lost[int(record["rank"])] = protocol.TaskPlace.from_record(record)
    return lost


def root_failure(store, what: str = "horovod.spark.run", spark_error: Optional[str] = None,
                 spark_partition: Optional[int] = None) -> Optional[HorovodSparkError]:
    """The error for the job's root failure, or None when no rank failed or was lost.

    A rank that failed on its own (its function raised, or its process died) comes first, the earliest of them;
    then a rank whose task vanished without a report (its executor died, or Spark killed it): the one in Spark's
    failed task ``spark_partition`` if it is one of them, and ``spark_error`` (Spark's account) says what
    happened; last, a rank that failed only because a peer was lost.
    """
    failed = failed_ranks(store)
    candidates: List[Tuple[bool, float, int, dict, Optional[dict]]] = []
    for rank, record in failed.items():
        result = _result(store, rank)
        candidates.append((_is_consequence(result), record["time"], rank, record, result))
    first = min(candidates, key=lambda c: c[:3]) if candidates else None
    lost = lost_ranks(store) if first is None or first[0] else {}
    if lost:
        by_partition = [r for r, place in lost.items() if place.partition == spark_partition]
        rank = by_partition[0] if by_partition else min(lost)
        place, result = lost[rank], None
        message = (f"{what}: rank {rank} on {place.describe()} was lost with its Spark task before it reported "
                   "an end (its executor died, or Spark killed the task)"
                   + (f". Spark reports: {spark_error}" if spark_error else "."))
    elif first is not None:
        _, _, rank, record, result = first
        place = protocol.TaskPlace.from_record(record)
        message = _message(what, rank, place, record, result)
    else:
        return None
    others = sorted(r for r in failed if r != rank)
    if others:
        message += f"\nRanks that failed after it: {', '.join(map(str, others))}. The job was stopped."
    error = HorovodSparkError(message, rank, place)
    if result is not None:
        error.__cause__ = result.get("exception")
    return error


def _message(what: str, rank: int, place: protocol.TaskPlace, record: dict, result: Optional[dict]) -> str:
    where = f"rank {rank} on {place.describe()}"
    if result is not None and not result["ok"]:
        traceback = str(result.get("traceback", "")).rstrip()
        return (f"{what}: the function raised {result.get('repr', 'an exception')} on {where}.\n"
                f"Traceback from rank {rank}:\n{traceback}")
    status = describe_returncode(record["returncode"])
    printed = report_lines(rank, record.get("exception") or [], record.get("last_lines") or [])
    return "\n".join([f"{what}: {where} exited ({status}) before it reported a result.", *printed])
