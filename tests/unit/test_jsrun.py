"""``horovodrun --jsrun``: the rankfile, the jsrun command line and environment, when jsrun mode is chosen,
and a whole launch through a fake ``jsrun`` that records its argv and runs the ranks locally."""
import json
import logging
import os
import shlex
import sys

import pytest

from horovod.common import build
from horovod.common.wire import SECRET_ENV
from horovod.runner import js_run, launch
from horovod.runner.common.util.settings import Settings
from tests.support import lsf as recorded

pytestmark = pytest.mark.timeout(60)

UPSTREAM_RANKFILE = """\
overlapping_rs: allow
cpu_index_using: logical

rank: 0: { hostname: host1; cpu: {0-9} ; gpu: * ; mem: * }
rank: 1: { hostname: host1; cpu: {10-19} ; gpu: * ; mem: * }
rank: 2: { hostname: host1; cpu: {20-29} ; gpu: * ; mem: * }
rank: 3: { hostname: host1; cpu: {30-39} ; gpu: * ; mem: * }

rank: 4: { hostname: host2; cpu: {0-9} ; gpu: * ; mem: * }
"""


def test_rankfile_matches_upstream():
    settings = Settings(num_proc=5, hosts="host1:4,host2:4,host3:4")
    assert js_run.rankfile_text(settings, cores=10, threads=4, slots_per_host=4) == UPSTREAM_RANKFILE


def test_rankfile_rejects_hosts_that_do_not_fit():
    with pytest.raises(ValueError, match=r"'host1:8' is greater than the number of ranks a node takes \(6\)"):
        js_run.rankfile_text(Settings(num_proc=2, hosts="host1:8"), 40, 4, 6)
    with pytest.raises(ValueError, match="Not enough slots on the hosts to fulfill the 13 requested"):
        js_run.rankfile_text(Settings(num_proc=13, hosts="a:6,b:6"), 40, 4, 6)


def test_summit_rankfile_from_csm_and_lscpu(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.SUMMIT)
    path = js_run.generate_jsrun_rankfile(Settings(num_proc=8, hosts="a01n01:6,a01n02:6"), str(tmp_path / "rf"))
    lines = open(path).read().splitlines()
    assert lines[3] == "rank: 0: { hostname: a01n01; cpu: {0-25} ; gpu: * ; mem: * }"   # 40 cores * 4 / 6
    assert lines[8] == "rank: 5: { hostname: a01n01; cpu: {130-155} ; gpu: * ; mem: * }"
    assert lines[10] == "rank: 6: { hostname: a01n02; cpu: {0-25} ; gpu: * ; mem: * }"
    assert len([line for line in lines if line.startswith("rank:")]) == 8


def test_jsrun_command_line():
    settings = Settings(num_proc=4, hosts="a:2,b:2", output_filename="/gpfs/out", tcp_flag=True,
                        extra_mpi_args="-x FOO --verbose")
    assert js_run.build_jsrun_command(settings, ["python", "train.py", "--lr", "0.1"], "/tmp/rf") == [
        "jsrun", "--erf_input", "/tmp/rf", "--stdio_stderr", "/gpfs/out", "--stdio_stdout", "/gpfs/out",
        "--smpiargs", "-tcp -x FOO --verbose", "python", "train.py", "--lr", "0.1"]
    settings = Settings(num_proc=4, hosts="a:2,b:2", binding_args="-n 4 -a 1 -c 7 -g 1 -r 2")
    assert js_run.build_jsrun_command(settings, ["cmd"], None, jsrun="/opt/jsrun") == [
        "/opt/jsrun", "-n", "4", "-a", "1", "-c", "7", "-g", "1", "-r", "2", "cmd"]


def test_jsrun_env_selects_mpi_and_keeps_the_secret_out():
    env = {"PATH": "/bin", SECRET_ENV: "s" * 64, "HOROVOD_RANK": "3", "HOROVOD_FUSION_THRESHOLD": "1024"}
    out = js_run.jsrun_env(Settings(num_proc=2, hosts="a:2", tcp_flag=True, start_timeout=45), ["ib0"], env)
    assert out["HOROVOD_CONTROLLER"] == "mpi" and out["HOROVOD_START_TIMEOUT"] == "45"
    assert out["NCCL_IB_DISABLE"] == "1" and out["NCCL_SOCKET_IFNAME"] == "ib0"
    assert out["HOROVOD_FUSION_THRESHOLD"] == "1024" and out["PATH"] == "/bin"
    assert SECRET_ENV not in out and "HOROVOD_RANK" not in out
    assert js_run.jsrun_env(Settings(num_proc=1, hosts="a:1"), None, env, export_secret=True)[SECRET_ENV]


def parse(*argv):
    return launch.parse_args(list(argv))


def test_jsrun_flag_outside_lsf_is_an_error(monkeypatch):
    monkeypatch.delenv("LSB_JOBID", raising=False)
    with pytest.raises(ValueError, match="did not detect an LSF job.*submit the job with bsub.*--mpi"):
        launch._run(parse("-np", "1", "--jsrun", "cmd"))


def test_jsrun_flag_needs_mpi(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.SUMMIT, jsrun=True)
    monkeypatch.setattr(build, "mpi_built", lambda: False)
    with pytest.raises(ValueError, match=r"MPI controller, which needs mpi4py: `pip install horovod\[mpi\]`"):
        launch._run(parse("--jsrun", "cmd"))


@pytest.mark.parametrize("job, jsrun, flags, mpi, expected", [
    (recorded.SUMMIT, True, [], True, True),          # LSF with jsrun installed: jsrun, as upstream
    (recorded.SUMMIT, True, ["--gloo"], True, False),
    (recorded.SUMMIT, True, ["--mpi"], True, False),
    (recorded.SUMMIT, True, [], False, False),        # no MPI: the built-in controller
    (recorded.PLAIN, False, [], True, False),         # no jsrun installed
    (recorded.PLAIN, False, ["--jsrun"], True, True),  # asked for: chosen (and fails later if missing)
    ({}, True, [], True, False),                      # jsrun installed but no LSF job
])
def test_mode_follows_upstreams_rules(monkeypatch, tmp_path, job, jsrun, flags, mpi, expected):
    recorded.install(monkeypatch, tmp_path, job, jsrun=jsrun)
    monkeypatch.setattr(build, "mpi_built", lambda: mpi)
    assert launch._use_jsrun(parse("-np", "2", *flags, "cmd")) is expected


def test_missing_jsrun_is_a_clear_error(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.PLAIN)
    monkeypatch.setattr(build, "mpi_built", lambda: True)
    with pytest.raises(ValueError, match="needs the jsrun command, and none was found on PATH"):
        launch._run(parse("-np", "2", "--jsrun", "cmd"))


def test_elastic_rejects_jsrun(monkeypatch, tmp_path):
    recorded.install(monkeypatch, tmp_path, recorded.SUMMIT, jsrun=True)
    with pytest.raises(ValueError, match="drop --mpi / --jsrun"):
        launch._run(parse("--min-np", "2", "--jsrun", "cmd"))


RANK_PROGRAM = ("import os, sys; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], os.environ['HOROVOD_CONTROLLER'], "
                "os.environ.get('TRAIN_FLAG')); sys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == sys.argv[1] else 0)")


def _summit_job(monkeypatch, tmp_path):
    from horovod.runner.common.util import network

    recorded.install(monkeypatch, tmp_path, recorded.SUMMIT, jsrun=True)
    monkeypatch.setattr(build, "mpi_built", lambda: True)
    monkeypatch.setattr(network, "filter_local_addresses", lambda names: list(names))
    monkeypatch.setenv("TRAIN_FLAG", "from-the-launch-node")


def test_whole_launch_through_a_fake_jsrun(monkeypatch, tmp_path, capfd):
    _summit_job(monkeypatch, tmp_path)
    launch.run_commandline(["-np", "3", "--fusion-threshold-mb", "8", sys.executable, "-c", RANK_PROGRAM, "-1"])
    seen = json.loads((tmp_path / "jsrun.json").read_text())
    argv = seen["argv"]
    assert argv[0] == "--erf_input" and argv[2:] == [sys.executable, "-c", RANK_PROGRAM, "-1"]
    assert seen["env"]["HOROVOD_CONTROLLER"] == "mpi" and seen["env"]["TRAIN_FLAG"] == "from-the-launch-node"
    assert seen["env"]["HOROVOD_FUSION_THRESHOLD"] == str(8 * 1024 * 1024) and SECRET_ENV not in seen["env"]
    assert [line for line in seen["rankfile"].splitlines() if line.startswith("rank:")] == [
        "rank: 0: { hostname: a01n01; cpu: {0-25} ; gpu: * ; mem: * }",
        "rank: 1: { hostname: a01n01; cpu: {26-51} ; gpu: * ; mem: * }",
        "rank: 2: { hostname: a01n01; cpu: {52-77} ; gpu: * ; mem: * }"]
    assert not os.path.exists(argv[1]), "the rankfile is removed after the job"
    out = capfd.readouterr().out
    for rank in range(3):
        assert f"rank {rank} mpi from-the-launch-node" in out


def test_failed_rank_exit_status_through_a_fake_jsrun(monkeypatch, tmp_path, caplog):
    _summit_job(monkeypatch, tmp_path)
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exc:
        launch.run_commandline(["-np", "2", sys.executable, "-c", RANK_PROGRAM, "1"])
    assert exc.value.code == 3
    assert "jsrun exited with code 3" in caplog.text and shlex.quote(RANK_PROGRAM) in caplog.text


def test_horovod_run_through_a_fake_jsrun(monkeypatch, tmp_path):
    import horovod.runner

    _summit_job(monkeypatch, tmp_path)
    monkeypatch.setattr(js_run.LSFUtils, "get_num_threads", staticmethod(lambda: 4))

    def fn(base):
        import os
        return base + int(os.environ["OMPI_COMM_WORLD_RANK"])

    assert horovod.runner.run(fn, args=(10,), np=2, hosts="localhost:6") == [10, 11]
