"""horovodrun flag parsing (every group) and the flags -> HOROVOD_* env mapping."""
import pytest

from horovod.runner import launch
from horovod.runner.common.util import config_parser


def parse(*argv):
    return launch.parse_args(list(argv))


def env_of(*argv):
    return config_parser.set_env_from_args({}, parse(*argv))


def test_defaults_and_command():
    args = parse("-np", "2", "python", "train.py", "--lr", "0.1", "--verbose")
    assert args.np == 2
    assert args.command == ["python", "train.py", "--lr", "0.1", "--verbose"]
    assert args.verbose is False
    assert args.hosts is None and args.hostfile is None and args.host_discovery_script is None
    assert args.use_gloo is False and args.use_mpi is False and args.use_jsrun is False
    assert args.fusion_threshold_mb is None and args.cycle_time_ms is None and args.cache_capacity is None
    assert args.autotune is None and args.autotune_warmup_samples == 3 and args.autotune_steps_per_sample == 10
    assert args.autotune_bayes_opt_max_samples == 20 and args.autotune_gaussian_process_noise == 0.8
    assert args.stall_check_warning_time_seconds == 60 and args.stall_check_shutdown_time_seconds == 0
    assert args.num_nccl_streams == 1 and args.gloo_timeout_seconds == 30
    assert args.run_func is None and args.executable is None
    assert args.nics is None and args.start_timeout is None and args.output_filename is None


def test_double_dash_before_command_is_dropped():
    assert parse("-np", "1", "--", "python", "x.py").command == ["python", "x.py"]


def test_np_required_unless_check_build(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("python", "x.py")
    assert exc.value.code == 2
    called = []
    monkeypatch.setattr(launch, "check_build", lambda verbose: called.append(verbose))
    args = parse("-cb")
    assert args.check_build is True and args.np is None and called == [False]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--version")
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == launch._version()


def test_general_and_ssh_flags():
    args = parse("-np", "4", "--disable-cache", "--start-timeout", "45", "--network-interfaces", "eth0,eth1",
                 "--output-filename", "/tmp/out", "--verbose", "-p", "2222", "-i", "/k", "-H", "a:2,b:2", "cmd")
    assert args.disable_cache is True and args.start_timeout == 45 and args.nics == "eth0,eth1"
    assert args.output_filename == "/tmp/out" and args.verbose is True
    assert args.ssh_port == 2222 and args.ssh_identity_file == "/k" and args.hosts == "a:2,b:2"
    assert launch._normalize_nics(args.nics) == ["eth0", "eth1"]


def test_deprecated_network_interface_is_repeatable():
    with pytest.warns(DeprecationWarning):
        args = parse("-np", "1", "--network-interface", "eth0", "--network-interface", "ib0", "cmd")
    assert launch._normalize_nics(args.nics) == ["eth0", "ib0"]
    assert launch._normalize_nics({"b", "a"}) == ["a", "b"]


def test_tunable_params_env():
    env = env_of("-np", "1", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
                 "--hierarchical-allreduce", "--no-hierarchical-allgather", "--torus-allreduce", "cmd")
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert env["HOROVOD_CACHE_CAPACITY"] == "0"
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HOROVOD_HIERARCHICAL_ALLGATHER"] == "0"
    assert env["HOROVOD_TORUS_ALLREDUCE"] == "1"


def test_unset_flags_export_only_defaults():
    env = env_of("-np", "1", "cmd")
    assert env == {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
        "HOROVOD_NUM_NCCL_STREAMS": "1",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
    }


@pytest.mark.parametrize("flag", ["--hierarchical-allreduce", "--hierarchical-allgather", "--torus-allreduce",
                                  "--autotune", "--timeline-mark-cycles", "--no-stall-check",
                                  "--mpi-threads-disable"])
def test_bool_flags_have_exclusive_negation(flag):
    negation = "--stall-check" if flag == "--no-stall-check" else "--no-" + flag[2:]
    with pytest.raises(SystemExit):
        parse("-np", "1", flag, negation, "cmd")
    dest = flag[2:].replace("-", "_")
    assert getattr(parse("-np", "1", negation, "cmd"), dest) is False
    assert getattr(parse("-np", "1", flag, "cmd"), dest) is True


def test_autotune_env_only_with_autotune():
    env = env_of("-np", "1", "--autotune-log-file", "/tmp/at.csv", "--autotune-warmup-samples", "5", "cmd")
    assert not any(k.startswith("HOROVOD_AUTOTUNE") for k in env)
    env = env_of("-np", "1", "--autotune", "--autotune-log-file", "/tmp/at.csv", "--autotune-warmup-samples",
                 "5", "--autotune-steps-per-sample", "7", "--autotune-bayes-opt-max-samples", "9",
                 "--autotune-gaussian-process-noise", "0.5", "cmd")
    assert env["HOROVOD_AUTOTUNE"] == "1"
    assert env["HOROVOD_AUTOTUNE_LOG"] == "/tmp/at.csv"
    assert env["HOROVOD_AUTOTUNE_WARMUP_SAMPLES"] == "5"
    assert env["HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"] == "7"
    assert env["HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"] == "9"
    assert env["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"] == "0.5"


def test_timeline_env_only_with_filename():
    assert "HOROVOD_TIMELINE_MARK_CYCLES" not in env_of("-np", "1", "--timeline-mark-cycles", "cmd")
    env = env_of("-np", "1", "--timeline-filename", "/tmp/tl.json", "--timeline-mark-cycles", "cmd")
    assert env["HOROVOD_TIMELINE"] == "/tmp/tl.json" and env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    env = env_of("-np", "1", "--timeline-filename", "/tmp/tl.json", "cmd")
    assert "HOROVOD_TIMELINE_MARK_CYCLES" not in env


def test_stall_check_env():
    env = env_of("-np", "1", "--no-stall-check", "--stall-check-warning-time-seconds", "10",
                 "--stall-check-shutdown-time-seconds", "20", "cmd")
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "10"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "20"
    assert env_of("-np", "1", "--stall-check", "cmd")["HOROVOD_STALL_CHECK_DISABLE"] == "0"


def test_library_options():
    args = parse("-np", "1", "--mpi-threads-disable", "--mpi-args=--map-by ppr:6:node", "--tcp",
                 "--binding-args=--rankfile f", "--num-nccl-streams", "2", "--thread-affinity", "0,2",
                 "--gloo-timeout-seconds", "90", "cmd")
    assert args.mpi_args == "--map-by ppr:6:node" and args.tcp_flag is True and args.binding_args == "--rankfile f"
    env = config_parser.set_env_from_args({}, args)
    assert env["HOROVOD_MPI_THREADS_DISABLE"] == "1"
    assert env["HOROVOD_NUM_NCCL_STREAMS"] == "2"
    assert env["HOROVOD_THREAD_AFFINITY"] == "0,2"
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "90"


def test_logging_flags():
    env = env_of("-np", "1", "--log-level", "DEBUG", "--log-without-timestamp", "cmd")
    assert env["HOROVOD_LOG_LEVEL"] == "DEBUG" and env["HOROVOD_LOG_HIDE_TIME"] == "1"
    assert env_of("-np", "1", "--log-with-timestamp", "cmd")["HOROVOD_LOG_HIDE_TIME"] == "0"
    assert "HOROVOD_LOG_HIDE_TIME" not in env_of("-np", "1", "cmd")
    with pytest.warns(DeprecationWarning):
        assert parse("-np", "1", "--log-hide-timestamp", "cmd").log_with_timestamp is False
    with pytest.warns(DeprecationWarning):
        assert parse("-np", "1", "--no-log-hide-timestamp", "cmd").log_with_timestamp is True
    with pytest.raises(SystemExit):
        parse("-np", "1", "--log-without-timestamp", "--log-with-timestamp", "cmd")
    with pytest.raises(SystemExit):
        parse("-np", "1", "--log-level", "LOUD", "cmd")
    assert parse("-np", "1", "-prefix-timestamp", "cmd").prefix_output_with_timestamp is True
    assert parse("-np", "1", "--prefix-output-with-timestamp", "cmd").prefix_output_with_timestamp is True


def test_hosts_group_is_exclusive():
    assert parse("-np", "1", "-hostfile", "hf", "cmd").hostfile == "hf"
    assert parse("-np", "1", "--host-discovery-script", "d.sh", "cmd").host_discovery_script == "d.sh"
    with pytest.raises(SystemExit):
        parse("-np", "1", "-H", "a:1", "--hostfile", "hf", "cmd")
    with pytest.raises(SystemExit):
        parse("-np", "1", "-H", "a:1", "--host-discovery-script", "d.sh", "cmd")


def test_controller_group_is_exclusive():
    assert parse("-np", "1", "--gloo", "cmd").use_gloo is True
    assert parse("-np", "1", "--mpi", "cmd").use_mpi is True
    assert parse("-np", "1", "--jsrun", "cmd").use_jsrun is True
    with pytest.raises(SystemExit):
        parse("-np", "1", "--gloo", "--mpi", "cmd")


def test_elastic_flags_parse():
    args = parse("-np", "2", "--min-np", "1", "--max-num-proc", "4", "--slots-per-host", "2",
                 "--elastic-timeout", "60", "--reset-limit", "3", "--blacklist-cooldown-range", "5", "50", "cmd")
    assert (args.min_np, args.max_np, args.slots, args.elastic_timeout, args.reset_limit) == (1, 4, 2, 60, 3)
    assert args.cooldown_range == [5, 50]
    assert launch._is_elastic(args)
    assert not launch._is_elastic(parse("-np", "2", "--max-np", "4", "cmd"))


@pytest.mark.parametrize("argv", [
    ["--fusion-threshold-mb", "-1"],
    ["--cycle-time-ms", "-0.5"],
    ["--cache-capacity", "-2"],
    ["--autotune-gaussian-process-noise", "1.5"],
    ["--stall-check-warning-time-seconds", "-1"],
    ["--num-nccl-streams", "-1"],
    ["--gloo-timeout-seconds", "-1"],
    ["--thread-affinity", "a,b"],
])
def test_invalid_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("-np", "1", *argv, "cmd")
    assert exc.value.code == 2
    assert "horovodrun: error:" in capsys.readouterr().err


def test_jsrun_outside_lsf_is_rejected_with_explanation(monkeypatch):
    monkeypatch.delenv("LSB_JOBID", raising=False)
    with pytest.raises(ValueError, match="did not detect an LSF job.*--mpi"):
        launch._run(parse("-np", "1", "--jsrun", "cmd"))


def test_elastic_flags_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="Cannot run in fault tolerance mode with fewer than 2 hosts"):
        launch._run(parse("-np", "1", "--min-np", "1", "cmd"))
    with pytest.raises(ValueError, match="--max-np 1 is smaller than -np/--min-np 2"):
        launch._run(parse("-np", "2", "--min-np", "2", "--max-np", "1", "-H", "a:1,b:1", "cmd"))
    with pytest.raises(ValueError, match="drop --mpi"):
        launch._run(parse("-np", "2", "--min-np", "1", "--mpi", "-H", "a:1,b:1", "cmd"))
    with pytest.raises(ValueError, match="cooldown range 9 2 is reversed"):
        launch._run(parse("-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "9", "2", "-H", "a:1,b:1", "c"))
    missing = tmp_path / "no-such-script.sh"
    with pytest.raises(RuntimeError, match="Host discovery failed on its first call.*" + str(missing)):
        launch._run(parse("-np", "1", "--host-discovery-script", str(missing), "cmd"))


def test_too_many_processes_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Requested more processes \(3\) than there are available slots \(2\)"):
        launch._run(parse("-np", "3", "-H", "localhost:2", "cmd"))


def test_np_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        launch._run(parse("-np", "0", "cmd"))


def test_missing_command_is_an_error():
    with pytest.raises(ValueError, match="No command"):
        launch._run(parse("-np", "1"))


def test_cli_exit_code_for_rejected_modes(caplog, monkeypatch):
    monkeypatch.delenv("LSB_JOBID", raising=False)
    with pytest.raises(SystemExit) as exc:
        launch.run_commandline(["-np", "1", "--jsrun", "cmd"])
    assert exc.value.code == 1
    assert "did not detect an LSF job" in caplog.text


def test_every_option_of_the_table_is_a_flag():
    from horovod.common import options

    parser = launch.make_parser(set(), set())
    flags = parser._option_string_actions
    for option in options.OPTIONS:
        names = option.names + tuple(n for switch in option.switches for n in switch.names)
        for name in names:
            assert name in flags and (option.kind == options.VERSION or flags[name].dest == option.dest), name
        if option.defaulted:
            assert parser.get_default(option.dest) == option.default is not None


def test_inert_flags_say_they_have_no_effect(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--hierarchical-allgather", "--torus-allreduce", "--num-nccl-streams"):
        assert f"{flag}" in text
    assert text.count("Accepted, no effect in this release.") == 3      # --hierarchical-allreduce selects Adasum's
    assert "the flag selects hierarchical Adasum" in text


def test_run_keywords_map_onto_the_table(monkeypatch):
    import horovod.runner as runner

    seen = []
    monkeypatch.setattr(launch, "_run", lambda hargs: seen.append(hargs) or ["ok"])
    with pytest.warns(DeprecationWarning):
        assert runner.run(print, num_proc=2, min_np=1, hosts="a:2", network_interface="eth0", slots=3,
                          ssh_port=2222, use_mpi=True, mpi_args="-x A", executable="py", verbose=True) == ["ok"]
    hargs = seen[0]
    assert (hargs.np, hargs.min_np, hargs.max_np, hargs.hosts, hargs.nics) == (2, 1, None, "a:2", "eth0")
    assert (hargs.slots, hargs.ssh_port, hargs.use_mpi, hargs.mpi_args) == (3, 2222, True, "-x A")
    assert hargs.executable == "py" and hargs.verbose is True and hargs.prefix_output_with_timestamp is False
    assert callable(hargs.run_func) and hargs.fusion_threshold_mb is None
    runner.run(print)
    assert seen[1].np == 1 and seen[1].hosts is None
    with pytest.raises(ValueError, match="disagree"):
        runner.run(print, num_proc=2, np=3)
    with pytest.raises(ValueError, match="hosts and hostfile"):
        runner.run(print, hosts="a:1", hostfile="hf")


def test_the_runner_imports_neither_the_library_nor_the_package_attributes():
    import subprocess
    import sys

    code = ("import sys; import horovod.runner.launch, horovod.runner.gloo_run, horovod.runner.run_task, "
            "horovod.runner.build_info, horovod.runner.common.util.config_parser; from horovod.runner import run; "
            "bad = [m for m in sys.modules if m.startswith(('horovod.core', 'horovod.torch', 'horovod.tensorflow', "
            "'horovod.keras', 'horovod._keras', 'horovod.numpy', 'horovod.backends'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_version_comes_from_horovod_version():
    import horovod
    from horovod.version import __version__

    assert horovod.__version__ == __version__
