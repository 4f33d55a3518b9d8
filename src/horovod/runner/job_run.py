"""Run a job file's ``run`` lines on every process, one line at a time (``horovodrun --job``).

The launcher steps the lines: for line *k* it starts every process of the job (``sh -c <line>`` with the
process's ``HOROVOD_*`` rank environment, locally or over ssh, as :mod:`horovod.runner.gloo_run` starts any
rank), waits until every one of them exited, and only then starts line *k+1*. That wait is the barrier between
lines: no process can begin a line before all processes finished the previous one, and it needs no protocol
between the processes. Each line gets a fresh rendezvous (its own port and secret), so a line may be a Horovod
script that calls ``hvd.init()``. When a process fails, :func:`horovod.runner.process.run_workers` stops the
others (none is left behind) and :class:`JobLineFailedError` names the process, its host and the line.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import List, Mapping, Optional, Sequence

from .common.util.hosts import parse_host_files, parse_hosts
from .common.util.network import is_local_host
from .common.util.settings import Settings
from .gloo_run import host_alloc_plan, launch_gloo, reach_hosts
from .job_file import JobFile, RunLine
from .process import JobFailedError, WorkerExit, format_failure
from .rendezvous import RendezvousServer

log = logging.getLogger(__name__)

SHELL = "/bin/sh"


class JobLineFailedError(JobFailedError):
    """A ``run`` line failed on a process; the job was stopped. Names the process, its host and the line."""

    def __init__(self, failure: WorkerExit, line: RunLine, job: JobFile) -> None:
        super().__init__(failure)
        self.line = line
        left = len(job.run) - line.index
        not_run = f"; the {left} line(s) after it did not run" if left else ""
        headline = (f"Line {line.index} of {job.path}'s run list ({line.text!r}, file line {line.yaml_line}) "
                    f"failed on rank {failure.rank} (host {failure.hostname}, {failure.status}); the other "
                    f"processes were stopped{not_run}.")
        self.args = (f"{headline}\n{format_failure(failure)}",)


def worker_hosts(job: JobFile, hosts: Optional[str] = None, hostfile: Optional[str] = None) -> List[str]:
    """The host of each worker: the ``-H`` / ``--hostfile`` hosts in order, else this machine for all of them.

    A host may be given without a slot count (``-H host1,host2``); slot counts given are not used (the job file sets the processes per worker). ValueError when
    there are fewer hosts than workers; extra hosts are left unused.
    """
    if hostfile and not hosts:
        hosts = parse_host_files(hostfile)
    if not hosts:
        return ["localhost"] * job.workers
    entries = [entry.strip() for entry in hosts.split(",") if entry.strip()]
    names = [info.hostname for info in parse_hosts(",".join(e if ":" in e else f"{e}:1" for e in entries))]
    if job.workers > len(names):
        raise ValueError(f"{job.path} asks for {job.workers} workers but {len(names)} host(s) were given "
                         f"({', '.join(names)}); give one host per worker with -H/--hostfile, or lower "
                         "horovod.workers.")
    if job.workers < len(names):
        log.warning("%s has %d workers: using the first %d of the %d hosts given (%s unused)", job.path,
                    job.workers, job.workers, len(names), ", ".join(names[job.workers:]))
    return names[:job.workers]


def hosts_string(job: JobFile, hosts_of_workers: Sequence[str]) -> str:
    """The launcher's ``-H`` string: each host with ``processes`` slots per worker placed on it."""
    slots: dict = {}
    for host in hosts_of_workers:
        slots[host] = slots.get(host, 0) + job.processes
    return ",".join(f"{host}:{count}" for host, count in slots.items())


def check_num_proc(job: JobFile, np: Optional[int]) -> int:
    """``-np`` for the job: the job file's count; ValueError when a given ``-np`` disagrees."""
    if np is not None and np != job.num_proc:
        raise ValueError(f"-np {np} disagrees with {job.path}, which runs {job.num_proc} processes "
                         f"({job.workers} worker(s) x {job.processes} process(es)); drop -np or make them agree.")
    return job.num_proc


def check_resources(job: JobFile, hosts_of_workers: Sequence[str]) -> None:
    """Compare ``resources.cpus`` / ``mem`` of the workers on this machine with its CPUs and memory.

    The values are not enforced (no cgroup or affinity is set): a machine with less than its workers ask for
    gets a warning. Remote hosts are not inspected.
    """
    local = sum(1 for host in hosts_of_workers if is_local_host(host))
    if not local:
        return
    cpus = os.cpu_count() or 1
    if job.cpus is not None and job.cpus * local > cpus:
        log.warning("%s: %d worker(s) on this machine ask for %g CPUs each (resources.cpus) but it has %d; "
                    "they run anyway, sharing the CPUs", job.path, local, job.cpus, cpus)
    mem_mib = _total_memory_mib()
    if job.mem_mib is not None and mem_mib is not None and job.mem_mib * local > mem_mib:
        log.warning("%s: %d worker(s) on this machine ask for %d MiB each (resources.mem) but it has %d MiB; "
                    "they run anyway", job.path, local, job.mem_mib, mem_mib)


def _total_memory_mib() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return None


def run_job(job: JobFile, settings: Settings, env: Mapping[str, str]) -> None:
    """Run every line of ``job`` on all ``settings.num_proc`` processes, line after line.

    ``settings.hosts`` places the processes (see :func:`hosts_string`); ``env`` is the launcher's environment
    with the tunables applied. Raises :class:`JobLineFailedError` when a line fails on a process, or what
    :func:`horovod.runner.process.run_workers` raises (interrupted, a process that could not start).
    """
    plan = host_alloc_plan(settings)
    rendezvous_addr = reach_hosts(settings, plan)
    log.info("%s: %d line(s) on %d process(es)", job.path, len(job.run), len(plan))
    for line in job.run:
        log.info("line %d of %d: %s", line.index, len(job.run), line.text)
        output_dir = os.path.join(settings.output_filename, f"line.{line.index}") if settings.output_filename else None
        rendezvous = RendezvousServer(settings.verbose)
        rendezvous.start()
        try:
            launch_gloo([SHELL, "-c", line.text], dataclasses.replace(settings, output_filename=output_dir), env,
                        rendezvous, rendezvous_addr)
        except JobFailedError as exc:
            raise JobLineFailedError(exc.failure, line, job) from None
        finally:
            rendezvous.stop()
