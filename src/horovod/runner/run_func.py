"""The ``horovod.run(fn)`` protocol between the launcher and ``python -m horovod.runner.run_task``.

The launcher puts the cloudpickled function at scope ``runfunc``, key ``func`` of the job's (authenticated)
rendezvous store. Each rank runs it and puts a cloudpickled result record at scope ``runfunc_result``, key
``str(rank)``: ``{"ok": True, "value": ...}`` or ``{"ok": False, "traceback": str, "exception": exc or None}``.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable, List, Optional

FUNC_SCOPE = "runfunc"
FUNC_KEY = "func"
RESULT_SCOPE = "runfunc_result"


def encode_function(func: Callable[[], Any]) -> bytes:
    """Cloudpickle the (argument-less) function; TypeError explaining what cannot be shipped."""
    import cloudpickle

    try:
        return cloudpickle.dumps(func)
    except Exception as exc:
        raise TypeError(
            f"horovod.run could not pickle the function or its arguments to send them to the ranks: {exc}"
        ) from exc


def encode_success(value: Any) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps({"ok": True, "value": value})
    except Exception as exc:
        return encode_failure(TypeError(f"the function's return value could not be pickled: {exc}"),
                              traceback.format_exc())


def encode_failure(exc: BaseException, tb: str) -> bytes:
    import cloudpickle

    try:
        pickled_exc = cloudpickle.dumps(exc)
    except Exception:
        pickled_exc = None
    return cloudpickle.dumps({"ok": False, "traceback": tb, "exception": pickled_exc, "repr": repr(exc)})


def decode(payload: bytes) -> dict:
    import cloudpickle

    record = cloudpickle.loads(payload)
    if not record["ok"] and record.get("exception") is not None:
        try:
            record["exception"] = cloudpickle.loads(record["exception"])
        except Exception:
            record["exception"] = None
    return record


class RankFunctionError(RuntimeError):
    """The function passed to ``horovod.run`` raised on a rank; the message carries the rank's traceback.

    ``headline``, when the launcher stopped the job for it, is the launcher's own report first (upstream's words:
    "Horovod detected that one or more processes exited with non-zero status ...", or "mpirun failed with exit
    code N" under MPI), which programs and tests match on."""

    def __init__(self, rank: int, hostname: Optional[str], record: dict, headline: str = "") -> None:
        self.rank = rank
        self.hostname = hostname
        self.remote_traceback = record.get("traceback", "")
        where = f"rank {rank}" + (f" (host {hostname})" if hostname else "")
        super().__init__(
            (f"{headline.rstrip()}\n" if headline else "")
            + f"horovod.run: the function raised {record.get('repr', 'an exception')} on {where}.\n"
            f"Traceback from {where}:\n{self.remote_traceback.rstrip()}"
        )


def failure_for_rank(store, rank: int, hostname: Optional[str], headline: str = "") -> Optional[RankFunctionError]:
    """The RankFunctionError for ``rank`` if it reported an exception, else None."""
    payload = store.get(RESULT_SCOPE, str(rank))
    if payload is None:
        return None
    record = decode(payload)
    if record["ok"]:
        return None
    error = RankFunctionError(rank, hostname, record, headline)
    error.__cause__ = record.get("exception")
    return error


def collect_results(store, num_proc: int) -> List[Any]:
    """Every rank's return value, indexed by rank; RuntimeError when a rank reported none or failed."""
    results = []
    for rank in range(num_proc):
        payload = store.get(RESULT_SCOPE, str(rank))
        if payload is None:
            raise RuntimeError(f"horovod.run: rank {rank} exited without reporting a result.")
        record = decode(payload)
        if not record["ok"]:
            error = RankFunctionError(rank, None, record)
            raise error from record.get("exception")
        results.append(record["value"])
    return results
