"""The function each barrier task of ``horovod.spark.run`` runs: one rank per task."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Iterator, Mapping, Optional


def make_task_fn(addr: str, port: int, secret: str, job_env: Mapping[str, str],
                 user_env: Optional[Mapping[str, str]], executable: Optional[str],
                 connect_timeout: float) -> Callable[[Iterable], Iterator[int]]:
    """The ``mapPartitions`` function of the job's barrier stage. The secret travels in this closure (Spark
    ships it to the executors with the task), never on a command line."""
    job_env, user_env = dict(job_env), dict(user_env or {})

    def horovod_spark_task(_: Iterable) -> Iterator[int]:
        from horovod.spark.static_task import run_rank_task

        yield run_rank_task(addr, port, secret, job_env, user_env, executable, connect_timeout)

    return horovod_spark_task


def run_rank_task(addr: str, port: int, secret: str, job_env: Dict[str, str], user_env: Dict[str, str],
                  executable: Optional[str], connect_timeout: float) -> int:
    """Place this task's rank from the barrier stage's task list, run it, report its end; returns the rank.

    Raises RuntimeError (failing the barrier stage, so Spark stops the other tasks) when the rank failed, or when
    this is a retry of a task that already ran: a Horovod job is never re-run piecemeal.
    """
    from pyspark import BarrierTaskContext

    from horovod.common import wire
    from horovod.common.kvstore import KVStoreClient
    from horovod.runner.gloo_run import slot_env
    from horovod.runner.process import describe_returncode

    from . import protocol
    from .task import RankProcess, place_ranks, rank_env, run_and_report

    ctx = BarrierTaskContext.get()
    partition = ctx.partitionId()
    addresses = [info.address for info in ctx.getTaskInfos()]
    hosts = [address.rsplit(":", 1)[0] for address in addresses]
    slot = place_ranks(hosts)[partition]
    place = protocol.TaskPlace(hosts[partition], protocol.executor_id(f"at {addresses[partition]}"), partition)
    client = KVStoreClient(addr, port, bytes.fromhex(secret), timeout=connect_timeout)
    try:
        if client.get(protocol.TASKS_SCOPE, str(partition)) is not None:
            raise RuntimeError(f"horovod.spark.run: Spark retried task {partition} after a failure; a Horovod job "
                               "is not retried piecemeal, see the first failure.")
        client.put(protocol.TASKS_SCOPE, str(partition), wire.pack({**place.to_record(), "rank": slot.rank}))
        variables = {**job_env, **slot_env(slot)}
        rank = RankProcess(client, addr, port, secret, rank_env(user_env, variables), executable, slot.rank)
        returncode = run_and_report(client, rank, str(slot.rank), place)
    finally:
        client.close()
    if returncode != 0:
        raise RuntimeError(f"horovod.spark.run: rank {slot.rank} on {place.describe()} failed "
                           f"({describe_returncode(returncode)}).")
    return slot.rank
