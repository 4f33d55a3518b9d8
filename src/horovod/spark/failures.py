"""Turning the ranks' exit records into the error a user of ``horovod.spark.run`` sees: the first rank that
failed for a reason of its own (not a peer's failure), where it ran, and its traceback or last output lines."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from horovod.common import wire
from horovod.runner import run_func
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


def root_failure(store, what: str = "horovod.spark.run") -> Optional[HorovodSparkError]:
    """The error for the job's root failure, or None when no rank failed."""
    failed = failed_ranks(store)
    if not failed:
        return None
    candidates: List[Tuple[bool, float, int, dict, Optional[dict]]] = []
    for rank, record in failed.items():
        result = _result(store, rank)
        candidates.append((_is_consequence(result), record["time"], rank, record, result))
    _, _, rank, record, result = min(candidates, key=lambda c: c[:3])
    place = protocol.TaskPlace.from_record(record)
    message = _message(what, rank, place, record, result)
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
    lines: List[Any] = record.get("last_lines") or []
    text = f"{what}: {where} exited ({status}) before it reported a result."
    if lines:
        text += f"\nLast {len(lines)} output lines of rank {rank}:\n" + "\n".join("    " + str(line) for line in lines)
    else:
        text += f"\nRank {rank} printed nothing before it exited."
    return text
