"""The Spark-task side: start one rank's process, forward its output to the driver, report how it ended.

This code runs in a Spark executor's Python worker. The rank itself runs in a child process
(:mod:`horovod.spark.rank`), as upstream does: a crash of the rank cannot take the executor's Python worker down,
and no Horovod thread lingers in a worker Spark reuses. The child is in a session of its own and gets SIGTERM
when the task's process dies (Spark kills a cancelled task's Python worker), so no rank outlives its task.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Mapping, Optional

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient
from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.output_tail import OutputTail
from horovod.runner.process import _die_with_parent_fn, split_lines

from . import protocol

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup


def place_ranks(hosts: List[str]) -> List[SlotInfo]:
    """Each task's slot, by partition, given each task's host: ranks are contiguous per host (in the order the
    hosts first appear), so that tasks on one host are local peers with the right local rank and size."""
    order = list(dict.fromkeys(hosts))
    plan = get_host_assignments([HostInfo(h, hosts.count(h)) for h in order], len(hosts), len(hosts))
    by_place = {(s.hostname, s.local_rank): s for s in plan}
    return [by_place[(host, hosts[:partition].count(host))] for partition, host in enumerate(hosts)]


class RankProcess:
    """One rank's process, started from a task, whose output lines go to the driver through the store.

    ``label`` is the rank the driver prefixes the lines with. The secret is written to the child's stdin.
    """

    def __init__(self, client: KVStoreClient, addr: str, port: int, secret: str, env: Mapping[str, str],
                 executable: Optional[str], label: int) -> None:
        self._client = client
        self._label = label
        self.tail = OutputTail()
        argv = [executable or sys.executable, "-m", "horovod.spark.rank", addr, str(port)]
        self.proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_die_with_parent_fn())
        try:
            self.proc.stdin.write(secret.encode() + b"\n")
            self.proc.stdin.close()
        except OSError:
            pass  # it already exited: its status says why
        self._seq = 0
        self._lock = threading.Lock()
        self._pumps = [threading.Thread(target=self._pump, args=(pipe, name), daemon=True,
                                        name=f"horovod-spark-{name}")
                       for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        for pump in self._pumps:
            pump.start()

    def _pump(self, pipe: IO[bytes], stream: str) -> None:
        try:
            for raw in split_lines(pipe):
                line = raw.rstrip(b"\r\n")
                text = line.decode("utf-8", "replace")
                self.tail.add(text, text, stream)
                with self._lock:
                    self._seq += 1
                    key = f"{self._label}/{stream}/{self._seq}"
                try:
                    self._client.put(protocol.OUTPUT_SCOPE, key, wire.pack([self._label, stream, line]))
                except (OSError, ConnectionError):
                    pass  # the driver went away; keep draining so the rank never blocks on a full pipe
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def wait(self) -> int:
        """Wait for the process and its output; returns its Popen return code."""
        returncode = self.proc.wait()
        for pump in self._pumps:
            pump.join(timeout=5.0)
        return returncode

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank's process group (it and whatever it started)."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """SIGKILL the rank's process group if it is still running, and reap it."""
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait()


def rank_env(user_env: Optional[Mapping[str, str]], variables: Mapping[str, str]) -> Dict[str, str]:
    """The rank's environment: the executor's, then the user's ``env``, then the job's variables (never the
    secret: that goes over stdin)."""
    env = {k: v for k, v in os.environ.items() if k != wire.SECRET_ENV}
    env.update({str(k): str(v) for k, v in (user_env or {}).items()})
    env.update(variables)
    return env


def run_and_report(client: KVStoreClient, rank: RankProcess, exit_key: str, place: protocol.TaskPlace) -> int:
    """Wait for the rank, record how it ended under ``exit_key``; stop it when the task is interrupted."""
    try:
        returncode = rank.wait()
    finally:
        rank.stop()
    try:
        client.put(protocol.EXIT_SCOPE, exit_key,
                   protocol.exit_record(returncode, list(rank.tail.lines), place, time.time(),
                                        rank.tail.unseen_exception()))
    except (OSError, ConnectionError):
        log.warning("could not report the exit of rank %s to the Spark driver", exit_key)
    return returncode
