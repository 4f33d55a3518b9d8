"""The libraries ``python -m horovod.bench`` times, each behind one interface: this project (``horovod``), raw
mpi4py on Open MPI (``mpi4py``) and torch.distributed on Gloo (``gloo``).

A peer gives a call per op and message size that the timing loop repeats, a barrier, and ``agree`` (rank 0's
list of ints on every rank, in the peer's own library). Sizes follow nccl-tests: ``nbytes`` is the whole
buffer an allreduce or broadcast moves, what an allgather gathers, and what a reducescatter or alltoall starts
from on each rank; each rank contributes ``nbytes / n`` to an allgather and keeps ``nbytes / n`` of a
reducescatter (rounded down to whole elements, at least one).
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Callable, Dict, List, Optional

import numpy as np

log = logging.getLogger(__name__)

OPS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]
Run = Callable[[], None]


class Peer:
    """One library's collectives on ``float32`` buffers (see the module docstring for what a size means)."""

    name = ""

    rank: int
    size: int

    def runs(self, op: str, nbytes: int) -> Optional[Run]:
        """A call of ``op`` on buffers made now for ``nbytes``, or None when this peer lacks the op."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def agree(self, values: List[int]) -> List[int]:
        raise NotImplementedError

    def close(self) -> None:
        """Leave the library's job (the last call on this peer)."""


def _counts(nbytes: int, n: int) -> tuple:
    """(elements of the whole buffer, elements per rank's part), for float32."""
    part = max(1, nbytes // 4 // n)
    return part * n, part


class HorovodPeer(Peer):
    """This project, through the op layer every binding calls (``horovod.core.ops``): buffers made once and
    reused; allreduce, allgather, broadcast and reducescatter marked blocking, as the bindings' blocking calls
    mark theirs (a small one may take a fast round)."""

    name = "horovod"

    def __init__(self) -> None:
        import horovod.numpy as hvd
        from horovod.core import ops

        hvd.init()
        self._hvd, self._ops = hvd, ops
        self.rank, self.size = hvd.rank(), hvd.size()

    def runs(self, op: str, nbytes: int) -> Optional[Run]:
        ops, n = self._ops, self.size
        count, part = _counts(nbytes, n)
        x = np.ones(count, np.float32)
        out = np.empty_like(x)
        piece = np.ones(part, np.float32)
        name = f"bench.{op}.{nbytes}"

        def allreduce() -> None:
            with ops.blocking():
                ops.allreduce_async(x, out, name=name, op=self._hvd.Sum).wait()

        def allgather() -> None:
            with ops.blocking():
                ops.allgather_async(piece, name=name).wait()

        def broadcast() -> None:
            with ops.blocking():
                ops.broadcast_async(x, 0, output=x, name=name).wait()

        def reducescatter() -> None:
            with ops.blocking():
                ops.reducescatter_async(x, name=name, op=self._hvd.Sum).wait()

        table: Dict[str, Run] = {
            "allreduce": allreduce,
            "allgather": allgather,
            "broadcast": broadcast,
            "reducescatter": reducescatter,
            "alltoall": lambda: ops.alltoall_async(x, name=name).wait(),
        }
        return table.get(op)

    def barrier(self) -> None:
        self._hvd.barrier()

    def agree(self, values: List[int]) -> List[int]:
        return self._hvd.broadcast_object(values, 0, name="bench.agree")

    def close(self) -> None:
        self._hvd.shutdown()


def under_mpi() -> bool:
    """Whether this process was started by an MPI launcher (``mpirun``, ``horovodrun --mpi``, srun with PMI)."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"))


class Mpi4pyPeer(Peer):
    """Raw mpi4py on ``MPI.COMM_WORLD`` (the processes must have been started by an MPI launcher)."""

    name = "mpi4py"

    def __init__(self) -> None:
        from mpi4py import MPI

        self._mpi, self._comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()

    def runs(self, op: str, nbytes: int) -> Optional[Run]:
        comm, mpi, n = self._comm, self._mpi, self.size
        count, part = _counts(nbytes, n)
        x, y = np.ones(count, np.float32), np.empty(count, np.float32)
        piece = np.ones(part, np.float32)
        table: Dict[str, Run] = {
            "allreduce": lambda: comm.Allreduce(x, y, op=mpi.SUM),
            "allgather": lambda: comm.Allgather(piece, y),
            "broadcast": lambda: comm.Bcast(x, root=0),
            "reducescatter": lambda: comm.Reduce_scatter_block(x, piece, op=mpi.SUM),
            "alltoall": lambda: comm.Alltoall(x, y),
        }
        return table.get(op)

    def barrier(self) -> None:
        self._comm.Barrier()

    def agree(self, values: List[int]) -> List[int]:
        return self._comm.bcast(values, root=0)


def _rank0_address(hvd_peer: Optional[HorovodPeer]) -> str:
    """An address of rank 0 that every rank reaches: loopback when the job is on one host, else the address
    of rank 0's interface towards the launcher (``HOROVOD_GLOO_RENDEZVOUS_ADDR``) or its host name's."""
    if hvd_peer is None or hvd_peer._hvd.local_size() == hvd_peer.size:
        return "127.0.0.1"
    target = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if target:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))     # no packet is sent: this only picks the outgoing interface
            return probe.getsockname()[0]
    return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class GlooPeer(Peer):
    """torch.distributed on Gloo, CPU tensors. Under ``torchrun`` it joins from the environment; beside this
    project (``hvd_peer``) rank 0 picks an address and port and tells the others through Horovod."""

    name = "gloo"

    def __init__(self, hvd_peer: Optional[HorovodPeer] = None) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self._torch, self._dist = torch, dist
        if hvd_peer is None:
            dist.init_process_group("gloo")
        else:
            addr, port = hvd_peer._hvd.broadcast_object(
                (_rank0_address(hvd_peer), _free_port()) if hvd_peer.rank == 0 else None, 0, name="bench.gloo")
            dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=hvd_peer.rank,
                                    world_size=hvd_peer.size)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def runs(self, op: str, nbytes: int) -> Optional[Run]:
        torch, dist, n = self._torch, self._dist, self.size
        count, part = _counts(nbytes, n)
        x, y = torch.ones(count), torch.empty(count)
        piece = torch.ones(part)
        # torch 2.13 renamed the flat-tensor forms (the old names warn); older torch has only the old ones.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        table: Dict[str, Run] = {
            "allreduce": lambda: dist.all_reduce(x),
            "allgather": lambda: gather(y, piece),
            "broadcast": lambda: dist.broadcast(x, 0),
            "reducescatter": lambda: scatter(piece, x),
            "alltoall": lambda: dist.all_to_all_single(y, x),
        }
        return table.get(op)

    def barrier(self) -> None:
        self._dist.barrier()

    def agree(self, values: List[int]) -> List[int]:
        t = self._torch.tensor(values, dtype=self._torch.int64)
        self._dist.broadcast(t, 0)
        return [int(v) for v in t.tolist()]

    def close(self) -> None:
        self._dist.destroy_process_group()


def open_peers(names: List[str]) -> List[Peer]:
    """The peers named, started in this process (this project first, so that the others can use it to meet);
    a peer whose library is missing, or mpi4py outside an MPI launch, is skipped with a warning that says how
    to get it."""
    peers: List[Peer] = []
    hvd_peer = HorovodPeer() if "horovod" in names else None
    for name in names:
        if name == "horovod":
            peers.append(hvd_peer)
        elif name == "mpi4py":
            if not under_mpi():
                log.warning("mpi4py skipped: start the job with `horovodrun --mpi` or `mpirun` to compare with it")
                continue
            try:
                peers.append(Mpi4pyPeer())
            except ImportError:
                log.warning("mpi4py skipped: it is not installed (pip install mpi4py)")
        elif name == "gloo":
            try:
                peers.append(GlooPeer(hvd_peer))
            except ImportError:
                log.warning("gloo skipped: torch is not installed (pip install torch)")
        else:
            raise ValueError(f"unknown peer {name!r}: choose from horovod, mpi4py, gloo")
    return peers
