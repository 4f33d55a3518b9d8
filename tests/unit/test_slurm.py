"""Slurm without a cluster: the allocation's node lists and task counts, the srun command and environment, the
srun output relabelling and failure report, the per-task rank variables, and the plain-srun secret files."""
import io
import os
import stat
import types

import pytest

from horovod.common import slurm_rendezvous, topology
from horovod.common.wire import SECRET_ENV
from horovod.runner import srun_launch, srun_task
from horovod.runner.common.util.hosts import HostInfo, get_host_assignments, parse_hosts
from horovod.runner.util import slurm

NO_SCONTROL = {"PATH": "/nonexistent"}


@pytest.mark.parametrize("nodelist, expected", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu-a,cpu[8-10],login", ["gpu-a", "cpu8", "cpu9", "cpu10", "login"]),
    ("rack[1-2]-n[09-10]", ["rack1-n09", "rack1-n10", "rack2-n09", "rack2-n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
])
def test_expand_nodelist(nodelist, expected):
    assert slurm.expand_nodelist(nodelist) == expected


@pytest.mark.parametrize("bad", ["node[1-", "node[a-b]", "node[3-1]", "node]1["])
def test_expand_nodelist_rejects_what_it_cannot_read(bad):
    with pytest.raises(ValueError, match="Slurm node list"):
        slurm.expand_nodelist(bad)


def test_expand_counts():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("4") == [4]
    with pytest.raises(ValueError, match=r"not N or N\(xM\)"):
        slurm.expand_counts("2(x)")


def test_allocation_from_the_environment():
    env = {**NO_SCONTROL, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[01-03],gpu7",
           "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert slurm.using_slurm(env) and not slurm.using_slurm({})
    assert slurm.allocated_hosts(env) == [HostInfo("node01", 2), HostInfo("node02", 2), HostInfo("node03", 2),
                                          HostInfo("gpu7", 1)]
    assert slurm.hosts_string(env) == "node01:2,node02:2,node03:2,gpu7:1"
    assert slurm.num_processes(env) == 7
    # --nodes only: SLURM_TASKS_PER_NODE missing, the CPUs per node count the slots
    cpus = {**NO_SCONTROL, "SLURM_JOB_ID": "78", "SLURM_NODELIST": "a,b", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}
    assert slurm.hosts_string(cpus) == "a:8,b:8"


def test_allocation_errors_say_what_to_do():
    with pytest.raises(ValueError, match="node list is missing.*-H/--hostfile"):
        slurm.allocated_hosts({"SLURM_JOB_ID": "1"})
    with pytest.raises(ValueError, match="salloc -n 4"):
        slurm.allocated_hosts({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a"})
    with pytest.raises(ValueError, match="names 2 nodes but the task counts '3' cover 1"):
        slurm.allocated_hosts({**NO_SCONTROL, "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a,b",
                               "SLURM_TASKS_PER_NODE": "3"})


def test_scontrol_expands_the_nodelist_when_installed(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames weird[1-2]' ] && printf 'w-one\\nw-two\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": str(tmp_path), "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "weird[1-2]",
           "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert slurm.hosts_string(env) == "w-one:1,w-two:1"


def _args(**kw):
    base = dict(np=None, hosts=None, hostfile=None, host_discovery_script=None, min_np=None, use_mpi=None,
                use_jsrun=None, run_func=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_srun_mode_only_inside_slurm_without_hosts():
    env = {**NO_SCONTROL, "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert srun_launch.wanted(_args(), env)
    assert not srun_launch.wanted(_args(), {})
    for given in ({"hosts": "a:2"}, {"hostfile": "f"}, {"use_mpi": True}, {"min_np": 2}, {"run_func": len}):
        assert not srun_launch.wanted(_args(**given), env), given
    args = _args()
    srun_launch.apply_allocation(args, env)
    assert (args.np, args.hosts, args.slurm_step) == (4, "n1:2,n2:2", True)
    args = _args(np=3)
    srun_launch.apply_allocation(args, env)
    assert args.np == 3


def test_srun_command_and_placement():
    plan = get_host_assignments(parse_hosts("n1:2,n2:2,n3:1"), 4, 4)
    assert srun_launch.hostfile_text(plan) == "n1\nn1\nn2\nn2\n"
    argv = srun_launch.build_srun_command(4, ["python", "train.py", "--lr", "0.1"], "/usr/bin/srun", "/py")
    assert argv == ["/usr/bin/srun", "--ntasks=4", "--distribution=arbitrary", "--kill-on-bad-exit=1", "--label",
                    "--quit-on-interrupt", "/py", "-m", "horovod.runner.srun_task", "--",
                    "python", "train.py", "--lr", "0.1"]


def test_srun_environment_carries_the_secret_never_the_command_line():
    env = srun_launch.srun_env({"PATH": "/bin", "HOROVOD_RANK": "5", SECRET_ENV: "old"},
                               {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}, "ab" * 32, "/tmp/hosts")
    assert env[SECRET_ENV] == "ab" * 32 and env["SLURM_HOSTFILE"] == "/tmp/hosts"
    assert "HOROVOD_RANK" not in env and env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"
    assert not any("ab" * 32 in a for a in srun_launch.build_srun_command(2, ["python", "x.py"]))


def test_srun_output_is_relabelled_and_the_first_failed_task_named():
    out = srun_launch.SrunOutput(12, None)
    stdout, stderr = io.StringIO(), io.StringIO()
    out._targets = {"stdout": stdout, "stderr": stderr}
    for raw, stream in [(b" 0: hello\n", "stdout"), (b"11: eleven\n", "stdout"), (b" 3: oops\n", "stderr"),
                        (b" 0: slurmstepd-n1: error: *** STEP 6.0 ON n1 CANCELLED ***\n", "stderr"),
                        (b"srun: error: n2: task 3: Exited with exit code 4\n", "stderr"),
                        (b"srun: error: n1: tasks 0-2,4: Terminated\n", "stderr")]:
        out._line(raw, stream)
    assert stdout.getvalue() == "[0]<stdout>:hello\n[11]<stdout>:eleven\n"
    assert stderr.getvalue().startswith("[3]<stderr>:oops\nslurmstepd-n1: error: *** STEP 6.0")
    assert list(out.rank_tails[3].lines) == ["oops"] and list(out.rank_tails[0].lines) == ["hello"]
    assert srun_launch.first_failure(list(out.untagged["stderr"])) == (3, "n2", 4)
    assert srun_launch.first_failure(["srun: error: n1: task 2: Segmentation fault"]) == (2, "n1", -11)
    assert srun_launch.first_failure(["srun: error: n1: tasks 1,3: Killed"]) == (1, "n1", -9)
    assert srun_launch.first_failure(["srun: Job step aborted"]) is None


def test_srun_task_sets_the_rank_variables_from_slurms():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "5", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURMD_NODENAME": "n2"}
    assert srun_task.rank_env(env) == {
        "HOROVOD_HOSTNAME": "n2", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "5", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}
    with pytest.raises(ValueError, match="outside the job size"):
        srun_task.rank_env({**env, "SLURM_PROCID": "7"})


def test_topology_counts_shared_with_the_runner():
    assert topology.expand_slurm_counts("3(x2)") == [3, 3]
    assert topology._tasks_per_node("bad") is None


def _slurm_topo(rank):
    return topology.Topology(rank, 2, rank, 2, 0, 1, "h", "Slurm")


def test_plain_srun_secret_file_is_private_and_removed(tmp_path, monkeypatch):
    path = tmp_path / "shared" / "job.key"
    monkeypatch.setenv("HOROVOD_SECRET_FILE", str(path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", raising=False)
    monkeypatch.setattr(slurm_rendezvous, "_state", {})
    assert slurm_rendezvous.wanted(_slurm_topo(0)) and slurm_rendezvous.secret_path() == str(path)
    path.parent.mkdir()
    path.write_text("stale")                 # a stale file of an earlier step is replaced
    rank0 = slurm_rendezvous._state
    try:
        key, addr, port = slurm_rendezvous.locate(_slurm_topo(0), 5, "127.0.0.1")
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
        assert slurm_rendezvous.read_secret(str(path)) == key and len(key) == 32
        assert open(str(path) + ".addr").read() == f"127.0.0.1:{port}\n"
        monkeypatch.setattr(slurm_rendezvous, "_state", {})        # another rank of the step
        assert slurm_rendezvous._read(str(path), 5) == (key, addr, port)
        os.chmod(path, 0o644)
        with pytest.raises(RuntimeError, match="mode 0644, but it must be yours .* and mode 0600"):
            slurm_rendezvous.read_secret(str(path))
    finally:
        monkeypatch.setattr(slurm_rendezvous, "_state", rank0)
        slurm_rendezvous._shutdown()       # what rank 0 does at exit: stop the store, remove the files
    assert not path.exists() and not os.path.exists(str(path) + ".addr")


def test_plain_srun_wait_for_rank_0_times_out_with_advice(tmp_path):
    with pytest.raises(RuntimeError, match="directory must be one every node sees.*HOROVOD_SECRET_FILE"):
        slurm_rendezvous._read(str(tmp_path / "never.key"), 0.3)


def test_default_secret_path_is_per_job_step(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3"}
    assert slurm_rendezvous.secret_path(env) == str(tmp_path / ".horovod" / "slurm-42.3.key")
    assert not slurm_rendezvous.wanted(_slurm_topo(1), {**env, SECRET_ENV: "ab" * 32})


def test_srun_output_files_per_rank(tmp_path):
    out = srun_launch.SrunOutput(2, str(tmp_path), prefix_timestamp=False)
    out._targets = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    out._line(b"1: to stdout\n", "stdout")
    out._line(b"1: to stderr\n", "stderr")
    out._line(b"srun: error: not a rank's line\n", "stderr")
    out.close()
    assert (tmp_path / "rank.1" / "stdout").read_text() == "to stdout\n"
    assert (tmp_path / "rank.1" / "stderr").read_text() == "to stderr\n"
    assert not (tmp_path / "rank.0").exists()


def test_launch_without_srun_says_what_to_do():
    from horovod.runner.common.util.settings import Settings

    with pytest.raises(ValueError, match="srun is not on PATH.*-H/--hostfile"):
        srun_launch.launch(Settings(num_proc=2, hosts="n1:2"), {"PATH": "/nonexistent"}, ["python", "x.py"])
