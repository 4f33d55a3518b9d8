"""LSF: reading the allocation from recorded LSF environments, and horovodrun's defaults inside an LSF job.

LSF cannot run here; ``tests/support/lsf.py`` holds a Summit-class job (CSM, launch node, jsrun) and a plain
LSF cluster's job as LSF sets them.
"""
import pytest

from horovod.runner import launch
from horovod.runner.common.util.hosts import HostInfo
from horovod.runner.util import lsf
from tests.support import lsf as recorded


def test_inside_lsf_means_lsb_jobid_is_set():
    assert lsf.using_lsf({"LSB_JOBID": "7"})
    assert not lsf.using_lsf({"LSB_MCPU_HOSTS": "a 1"})


def test_mcpu_hosts_pairs_in_order_with_repeats_added():
    assert lsf.parse_mcpu_hosts("batch3 1 a01n01 42 a01n02 42") == [
        HostInfo("batch3", 1), HostInfo("a01n01", 42), HostInfo("a01n02", 42)]
    assert lsf.parse_mcpu_hosts(" h1 2  h2 4 h1 1 ") == [HostInfo("h1", 3), HostInfo("h2", 4)]
    for bad in ("h1 2 h2", "h1 x", ""):
        with pytest.raises(ValueError, match="not a list of '<host> <slots>' pairs"):
            lsf.parse_mcpu_hosts(bad)


def test_plain_cluster_keeps_its_first_execution_host(tmp_path):
    env = dict(recorded.PLAIN, PATH=str(tmp_path))          # no jsrun, no CSM
    assert not lsf.has_launch_node(env)
    assert lsf.compute_hosts(env) == [HostInfo("node017", 8), HostInfo("node018", 8)]


def test_summit_drops_its_launch_node(tmp_path):
    env = dict(recorded.SUMMIT, PATH=str(tmp_path))          # CSM_ALLOCATION_ID marks a launch node
    assert lsf.has_launch_node(env)
    assert lsf.allocated_hosts(env)[0] == HostInfo("batch3", 1)
    assert lsf.compute_hosts(env) == [HostInfo("a01n01", 42), HostInfo("a01n02", 42)]
    jsrun = tmp_path / "jsrun"
    jsrun.write_text("#!/bin/sh\n")
    jsrun.chmod(0o755)
    no_csm = {k: v for k, v in env.items() if k != "CSM_ALLOCATION_ID"}
    assert lsf.has_launch_node(no_csm), "jsrun on PATH marks a launch node too (LLNL's Lassen, Sierra)"
    assert lsf.compute_hosts(dict(no_csm, LSB_MCPU_HOSTS="lassen710 1")) == [HostInfo("lassen710", 1)]


def test_hostfile_then_lsb_hosts_when_mcpu_hosts_is_missing(tmp_path):
    hostfile = tmp_path / "1234567.hostfile"
    hostfile.write_text("batch3\n" + "a01n01\n" * 42 + "a01n02\n" * 42)
    env = {"LSB_JOBID": "1234567", "LSB_DJOB_HOSTFILE": str(hostfile), "LSB_HOSTS": "ignored 1",
           "PATH": str(tmp_path)}
    assert lsf.allocated_hosts(env) == [HostInfo("batch3", 1), HostInfo("a01n01", 42), HostInfo("a01n02", 42)]
    env = {"LSB_JOBID": "4242", "LSB_HOSTS": recorded.PLAIN["LSB_HOSTS"], "PATH": str(tmp_path),
           "LSB_DJOB_HOSTFILE": str(tmp_path / "gone")}
    assert lsf.allocated_hosts(env) == [HostInfo("node017", 8), HostInfo("node018", 8)]
    with pytest.raises(ValueError, match="LSB_JOBID=9.*none of LSB_MCPU_HOSTS.*-H/--hostfile"):
        lsf.allocated_hosts({"LSB_JOBID": "9"})


def test_summit_allocation_from_csm(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.SUMMIT)
    assert lsf.LSFUtils.using_lsf()
    assert lsf.LSFUtils.get_compute_hosts() == ["a01n01", "a01n02"]
    assert lsf.LSFUtils.get_num_gpus() == 6
    assert lsf.LSFUtils.get_num_cores() == 40            # 44 discovered, 2 per socket kept for the system
    assert lsf.LSFUtils.get_num_threads() == 4
    assert (tmp_path / "ssh.args").read_text().split()[-3:] == ["a01n01", "LANG=en_US.utf8", "lscpu"]
    assert lsf.LSFUtils.get_num_processes() == 12        # one rank per GPU
    assert lsf.LSFUtils.get_hosts_string() == "a01n01:6,a01n02:6"


def test_plain_cluster_allocation_from_lsf_slots(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.PLAIN)
    assert lsf.LSFUtils.get_num_gpus() == 0
    assert lsf.LSFUtils.get_num_cores() == 8
    assert lsf.LSFUtils.get_num_processes() == 16
    assert lsf.LSFUtils.get_hosts_string() == "node017:8,node018:8"


def test_failing_csm_query_names_the_tool(monkeypatch, tmp_path):
    bin_dir = recorded.install(monkeypatch, tmp_path, recorded.SUMMIT)
    (bin_dir / "csm_allocation_query").write_text("#!/bin/sh\necho 'allocation not found' >&2\nexit 4\n")
    with pytest.raises(RuntimeError, match="csm_allocation_query -a 3791001 failed with exit code 4: "
                                           "allocation not found"):
        lsf.LSFUtils.get_num_gpus()


def test_np_is_optional_only_inside_lsf(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit):
        launch.parse_args(["python", "train.py"])
    assert "-np/--num-proc" in capsys.readouterr().err
    recorded.install(monkeypatch, tmp_path, recorded.PLAIN)
    args = launch.parse_args(["python", "train.py"])
    assert args.np is None and args.command == ["python", "train.py"]


def _record_static_launch(monkeypatch):
    """Stub the built-in controller's launch and the ssh check; returns what they were called with."""
    from horovod.runner import gloo_run, ssh
    from horovod.runner.common.util import network

    calls = {}
    monkeypatch.setattr(network, "filter_local_addresses", lambda names: [n for n in names if n != "localhost"])
    monkeypatch.setattr(network, "get_driver_ip", lambda nics, remote=(): "10.1.0.17")
    monkeypatch.setattr(ssh, "check_all_hosts_ssh", lambda hosts, *a, **k: calls.setdefault("ssh", hosts))
    monkeypatch.setattr(gloo_run, "launch_gloo",
                        lambda command, settings, *a: calls.update(settings=settings, command=command))
    return calls


def test_default_mode_on_plain_lsf_uses_its_hosts_over_ssh(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.PLAIN)
    calls = _record_static_launch(monkeypatch)
    launch._run(launch.parse_args(["python", "train.py"]))
    assert calls["settings"].num_proc == 16 and calls["settings"].hosts == "node017:8,node018:8"
    assert calls["ssh"] == ["node017", "node018"] and calls["command"] == ["python", "train.py"]


def test_given_hosts_and_np_win_over_lsf(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.PLAIN)
    calls = _record_static_launch(monkeypatch)
    launch._run(launch.parse_args(["-np", "2", "-H", "localhost:2", "python", "train.py"]))
    assert calls["settings"].num_proc == 2 and calls["settings"].hosts == "localhost:2"
    assert "ssh" not in calls
    launch._run(launch.parse_args(["-np", "3", "python", "train.py"]))
    assert calls["settings"].num_proc == 3 and calls["settings"].hosts == "node017:8,node018:8"
