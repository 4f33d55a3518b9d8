"""Choosing the data plane for a job from where its ranks live and HOROVOD_CPU_OPERATIONS."""
from __future__ import annotations

import hashlib
import logging
from typing import Tuple

from horovod.backends.base import Backend
from horovod.backends.comm import Comm
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.local import LocalBackend
from horovod.backends.mesh import Mesh
from horovod.backends.shm import ShmBackend
from horovod.backends.tcp import TcpBackend
from horovod.common import config

log = logging.getLogger(__name__)

CHOICES = ("", "SHM", "TCP", "GLOO", "MPI", "AUTO")


def make_backend(mesh: Mesh, job: str, generation: int) -> Tuple[Backend, str]:
    """The backend for this rank and a sentence saying why it was chosen."""
    size, rank = mesh.size, mesh.rank
    if size == 1:
        return LocalBackend(), "a single rank needs no data plane"
    choice = config.get("HOROVOD_CPU_OPERATIONS")
    if choice not in CHOICES:
        raise ValueError(f"HOROVOD_CPU_OPERATIONS={choice.lower()!r} is not a data plane; choose shm, tcp "
                         "(or gloo, which means the built-in choice).")
    if choice == "MPI":
        raise ValueError("HOROVOD_CPU_OPERATIONS=mpi needs the MPI backend, which is not in this release yet; "
                         "unset it to use the built-in shm/tcp data plane.")
    comm = Comm(rank, list(range(size)), mesh.data, mesh.hosts)
    comm.set_spin(config.get("HOROVOD_SPIN_MICROSECONDS"))
    if choice == "TCP":
        return TcpBackend(comm), "tcp, forced by HOROVOD_CPU_OPERATIONS=tcp"
    hosts = mesh.hosts
    by_host = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    local = by_host[hosts[rank]]
    chunk = config.get("HOROVOD_SHM_CHUNK_BYTES")
    host_tag = hashlib.sha256(hosts[rank].encode()).hexdigest()[:8]
    tag = f"{job}-{generation}-{host_tag}"
    if len(by_host) == 1:
        return ShmBackend(comm, tag, chunk), "shm: every rank is on this host"
    if choice == "SHM":
        log.warning("HOROVOD_CPU_OPERATIONS=shm but the job spans %d hosts; using shm inside hosts and tcp "
                    "between them.", len(by_host))
    sizes = {len(v) for v in by_host.values()}
    if len(sizes) != 1:
        return TcpBackend(comm), (f"tcp: hosts have different numbers of ranks ({sorted(sizes)}), so the "
                                  "hierarchical algorithm does not apply")
    local_index = local.index(rank)
    cross = [members[local_index] for members in by_host.values()]
    backend = HierarchicalBackend(TcpBackend(comm), ShmBackend(comm.sub(local), tag, chunk),
                                  TcpBackend(comm.sub(sorted(cross))))
    return backend, f"hierarchical: shm inside each of {len(by_host)} hosts, tcp between them"
