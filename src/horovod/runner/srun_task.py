"""What each task of ``horovodrun``'s srun step runs first: ``python -m horovod.runner.srun_task COMMAND...``.

srun starts every task with one environment, so the per-rank variables that ``horovodrun`` sets for a rank it
starts itself (``HOROVOD_RANK``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_CROSS_RANK`` ...) are made here, from Slurm's
variables of this task (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE``,
read by :class:`horovod.common.topology.Slurm`); then this process becomes the user's command (``exec``), so
the rank's pid, signals and exit status are the command's own. The job secret and the rendezvous address come
unchanged in the environment srun passed on.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Mapping, Optional

from horovod.common import topology

# Set by horovodrun for srun's placement only; the rank's own srun calls must not inherit it.
HOSTFILE_ENV = "SLURM_HOSTFILE"


def rank_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The ``HOROVOD_*`` topology variables of this task, from Slurm's; ValueError when they are inconsistent."""
    topo = topology.Slurm().topology(dict(env)).validate()
    return {
        "HOROVOD_HOSTNAME": env.get("SLURMD_NODENAME") or topo.hostname,
        "HOROVOD_RANK": str(topo.rank),
        "HOROVOD_SIZE": str(topo.size),
        "HOROVOD_LOCAL_RANK": str(topo.local_rank),
        "HOROVOD_LOCAL_SIZE": str(topo.local_size),
        "HOROVOD_CROSS_RANK": str(topo.cross_rank),
        "HOROVOD_CROSS_SIZE": str(topo.cross_size),
    }


def main(argv: Optional[List[str]] = None) -> None:
    """Set this rank's variables and replace this process with the command; exit 127 when it cannot start."""
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        sys.stderr.write("horovod.runner.srun_task: no command given\n")
        sys.exit(2)
    env = dict(os.environ)
    try:
        env.update(rank_env(env))
    except ValueError as exc:
        sys.stderr.write(f"horovod.runner.srun_task: Slurm's task variables are unusable: {exc}\n")
        sys.exit(2)
    env.pop(HOSTFILE_ENV, None)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        sys.stderr.write(f"horovod.runner.srun_task: cannot run {command[0]!r}: {exc.strerror or exc}\n")
        sys.exit(127)


if __name__ == "__main__":
    main()
