"""Worker side of ``horovod.run``: ``python -m horovod.runner.run_task [<driver_addr> <port>]``.

Connects to the job's rendezvous store (address from the arguments or ``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT``,
secret from ``_HOROVOD_SECRET_KEY``; the rank from ``HOROVOD_RANK``, or from mpirun's ``OMPI_COMM_WORLD_RANK`` /
``PMI_RANK``), fetches the function, runs it, and stores its result or its exception
with the traceback under this rank. Exits 1 when the function raised.
"""
from __future__ import annotations

import sys
import traceback
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Run this rank's part of a ``horovod.run`` job; returns the process exit code."""
    from horovod.common import config, wire
    from horovod.common.kvstore import KVStoreClient
    from horovod.runner import run_func

    argv = sys.argv[1:] if argv is None else argv
    addr = argv[0] if len(argv) >= 2 else config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = int(argv[1]) if len(argv) >= 2 else config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    key = wire.secret_from_env()
    if not addr or not port or key is None:
        sys.stderr.write("horovod.runner.run_task must be started by horovod.run (no rendezvous address or "
                         "secret in the environment).\n")
        return 2
    client = KVStoreClient(addr, int(port), key, timeout=config.get("HOROVOD_START_TIMEOUT"))
    try:
        payload = client.get(run_func.FUNC_SCOPE, run_func.FUNC_KEY)
        if payload is None:
            sys.stderr.write("horovod.run: the launcher published no function to run.\n")
            return 2
        import cloudpickle

        try:
            func = cloudpickle.loads(payload)
            value = func()
        except Exception as exc:
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            client.put(run_func.RESULT_SCOPE, str(_rank()), run_func.encode_failure(exc, tb))
            return 1
        client.put(run_func.RESULT_SCOPE, str(_rank()), run_func.encode_success(value))
        return 0
    finally:
        client.close()


def _rank() -> int:
    """This rank, read after the function ran: in an elastic job the rank changes at every reset, and ``hvd.init``
    keeps ``HOROVOD_RANK`` current (``OMPI_COMM_WORLD_RANK``/``PMI_RANK`` under mpirun)."""
    from horovod.runner.common.util.env import get_env_rank_and_size

    placed = get_env_rank_and_size()
    return placed[0] if placed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
