"""Exportable env filtering and how the launcher builds the workers' environment."""
from horovod.common.wire import SECRET_ENV
from horovod.runner import gloo_run, launch
from horovod.runner.common.util import env as env_util
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.common.util.settings import Settings


def test_is_exportable():
    for name in ("BASH_FUNC_module%%", "OLDPWD", SECRET_ENV, "CUDA_VISIBLE_DEVICES", "NV_CUDA_VISIBLE_DEVICES"):
        assert not env_util.is_exportable(name), name
    for name in ("PATH", "HOROVOD_RANK", "PYTHONPATH", "CUDA_HOME", "LD_LIBRARY_PATH", "OLDPWD2"):
        assert env_util.is_exportable(name), name
    assert not env_util.is_exportable("1BAD") and not env_util.is_exportable("A-B")


def test_exportable_env():
    env = {"PATH": "/bin", SECRET_ENV: "s", "OLDPWD": "/", "CUDA_VISIBLE_DEVICES": "1", "X": "1"}
    assert env_util.exportable_env(env) == {"PATH": "/bin", "X": "1"}


def test_get_env_rank_and_size():
    assert env_util.get_env_rank_and_size({}) is None
    assert env_util.get_env_rank_and_size({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"}) == (1, 4)
    assert env_util.get_env_rank_and_size({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}) == (2, 3)
    assert env_util.get_env_rank_and_size({"PMI_RANK": "0", "PMI_SIZE": "2"}) == (0, 2)


def test_job_env():
    env = gloo_run.job_env("127.0.0.1", 1234, Settings(num_proc=2, hosts="localhost:2", start_timeout=45.0))
    assert env == {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_START_TIMEOUT": "45",
        "PYTHONUNBUFFERED": "1",
    }
    env = gloo_run.job_env("10.0.0.1", 1, Settings(num_proc=2, hosts="a:2", nics=["eth1", "eth0"], tcp_flag=True))
    assert env["HOROVOD_GLOO_IFACE"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "eth1,eth0"
    assert env["NCCL_IB_DISABLE"] == "1"


def test_slot_env():
    slot = SlotInfo("a", rank=2, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=2)
    assert gloo_run.slot_env(slot) == {
        "HOROVOD_HOSTNAME": "a", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}


def test_exported_values_survive_unset_defaulted_flags(monkeypatch):
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "5")
    env = launch._worker_base_env(launch.parse_args(["-np", "1", "cmd"]))
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "120" and env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "5"
    env = launch._worker_base_env(launch.parse_args(["-np", "1", "--gloo-timeout-seconds", "30", "cmd"]))
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"


def test_horovod_args_defaults_export_nothing():
    from horovod.runner import _HorovodArgs
    from horovod.runner.common.util import config_parser

    assert config_parser.set_env_from_args({}, _HorovodArgs()) == {}
