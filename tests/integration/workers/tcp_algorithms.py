"""Worker: every tcp allreduce and broadcast algorithm, each forced by its knob, in one job (tcp data plane).

For each algorithm the rank sets HOROVOD_TCP_ALLREDUCE_ALGORITHM (and, in turn, HOROVOD_TCP_BROADCAST_ALGORITHM),
initializes Horovod, checks that the tcp plane took the knob, runs allreduces of sizes on every path (Sum against
the exact result, Min/Max/Product, Average checked bitwise across ranks through an allgather) and broadcasts, and
shuts down. Prints ``TCP_ALGORITHMS_OK <rank> <size>`` at the end.
"""
import os

import numpy as np

import horovod.numpy as hvd
from horovod.backends.tcp import TcpBackend
from horovod.core import basics

ALLREDUCE = ["ring", "direct", "recursive_doubling", "rabenseifner"]
BROADCAST = ["binomial", "pipeline"]
COUNTS = [1, 1001, 70_001, 300_007]      # float32: 4 B to 1.2 MB, odd sizes


def check(algorithm: str, broadcast: str) -> None:
    backend = basics.engine().backend
    assert isinstance(backend, TcpBackend), basics.data_plane()
    assert (backend.allreduce_algorithm, backend.broadcast_algorithm) == (algorithm, broadcast)
    rank, size = hvd.rank(), hvd.size()
    for count in COUNTS:
        base = np.arange(count) % 7
        for dtype in (np.float32, np.int32):
            got = hvd.allreduce((base + rank).astype(dtype), op=hvd.Sum, name=f"sum.{count}.{dtype.__name__}")
            np.testing.assert_array_equal(got, (size * base + size * (size - 1) // 2).astype(dtype))
        signs = np.where(base % 2, 1.0, -1.0)
        got = hvd.allreduce(signs if rank == 0 else np.ones(count), op=hvd.Product, name=f"prod.{count}")
        np.testing.assert_array_equal(got, signs)
        got = hvd.allreduce(base - rank, op=hvd.Min, name=f"min.{count}")
        np.testing.assert_array_equal(got, base - (size - 1))
        noise = np.random.default_rng(rank * 1000 + count).standard_normal(count).astype(np.float32)
        mean = hvd.allreduce(noise, op=hvd.Average, name=f"avg.{count}")
        rows = hvd.allgather(mean[None], name=f"avg.g.{count}")
        assert all(row.tobytes() == rows[0].tobytes() for row in rows), f"{algorithm}: ranks differ at {count}"
        root = count % size
        sent = hvd.broadcast(base * (rank + 1.0), root, name=f"bcast.{count}")
        np.testing.assert_array_equal(sent, base * (root + 1.0))


def main() -> None:
    for i, algorithm in enumerate(ALLREDUCE):
        os.environ["HOROVOD_TCP_ALLREDUCE_ALGORITHM"] = algorithm
        os.environ["HOROVOD_TCP_BROADCAST_ALGORITHM"] = BROADCAST[i % 2]
        hvd.init()
        check(algorithm, BROADCAST[i % 2])
        hvd.shutdown()
    print("TCP_ALGORITHMS_OK", hvd.rank() if hvd.is_initialized() else os.environ["HOROVOD_RANK"],
          os.environ["HOROVOD_SIZE"], flush=True)


if __name__ == "__main__":
    main()
