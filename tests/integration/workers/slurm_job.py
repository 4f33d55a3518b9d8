"""A rank of the Slurm tests (tests/integration/test_slurm_cluster.py), started by srun (directly or by
horovodrun).

Prints one ``RESULT {json}`` line: its rank, size, local and cross rank, the HOROVOD_* and SLURM_* variables it
was started with, and allreduce / allgather results over every rank. Options:

- ``--fail R``: rank R prints a line and exits 3 after the first allreduces; the others sleep for a minute;
- ``--hold DIR``: every rank writes its pid to ``DIR/pid.<rank>`` after init, then sleeps for a minute;
- ``--probe-secret``: rank 1 (plain srun only) waits, before ``hvd.init``, until rank 0 has published the
  rendezvous, then records the secret file's mode, owner and directory mode, and checks that rank 0's store
  rejects a connection with a wrong secret. Rank 0 cannot remove the files before rank 1 joins, so this is exact.
"""
import argparse
import json
import os
import stat
import sys
import time

import numpy as np

import horovod.numpy as hvd
from horovod.common import slurm_rendezvous, wire
from horovod.common.kvstore import KVStoreClient


def probe_secret() -> dict:
    path = slurm_rendezvous.secret_path()
    deadline = time.monotonic() + 30
    while not os.path.exists(path + slurm_rendezvous.ADDR_SUFFIX):
        if time.monotonic() > deadline:
            return {"error": f"{path}.addr never appeared"}
        time.sleep(0.01)
    info, dir_info = os.stat(path), os.stat(os.path.dirname(path))
    with open(path + slurm_rendezvous.ADDR_SUFFIX) as f:
        host, _, port = f.read().strip().rpartition(":")
    try:
        KVStoreClient(host, int(port), b"\x00" * 32, timeout=5).close()
        rejected = "accepted a wrong secret"
    except wire.AuthenticationError as exc:
        rejected = str(exc)
    return {"path": path, "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid,
            "dir_mode": stat.S_IMODE(dir_info.st_mode), "wrong_secret": rejected}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", type=int, default=-1)
    parser.add_argument("--probe-secret", action="store_true")
    parser.add_argument("--hold", metavar="DIR", help="after init, write pid.<rank> into DIR and sleep 60 s")
    args = parser.parse_args()
    rank_env = os.environ.get("SLURM_PROCID")
    probe = probe_secret() if args.probe_secret and rank_env == "1" else None
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    sums = [float(hvd.allreduce(np.full(n, rank + 1.0), op=hvd.Sum)[-1]) for n in (1, 100_000)]
    if rank == args.fail:
        print(f"rank {rank} fails on purpose", flush=True)
        sys.exit(3)
    if args.hold:
        with open(os.path.join(args.hold, f"pid.{rank}"), "w") as f:
            f.write(str(os.getpid()))
    if args.fail >= 0 or args.hold:
        time.sleep(60)       # outside any collective: only the launcher's fail-fast can end this rank early
    gathered = hvd.allgather(np.array([rank], dtype=np.int64)).tolist()
    result = {
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sums": sums, "gathered": gathered,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("HOROVOD_", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_HOSTFILE"))},
        "has_secret_env": wire.SECRET_ENV in os.environ, "probe": probe,
    }
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
