"""--config-file: upstream's YAML sections and the position-sensitive override order."""
import logging
import textwrap

import pytest

from horovod.runner import launch
from horovod.runner.common.util import config_parser

FULL_CONFIG = textwrap.dedent("""\
    controller: gloo
    params:
      fusion_threshold_mb: 32
      cycle_time_ms: 10
      cache_capacity: 2048
      hierarchical_allreduce: true
      hierarchical_allgather: true
    autotune:
      enabled: true
      log_file: horovod_autotune_log.txt
      warmup_samples: 1
      steps_per_sample: 5
      bayes_opt_max_samples: 10
      gaussian_process_noise: 0.2
    timeline:
      filename: horovod_timeline.json
      mark_cycles: true
    stall_check:
      enabled: false
      warning_time_seconds: 120
      shutdown_time_seconds: 240
    library_options:
      mpi_threads_disable: true
      num_nccl_streams: 2
      thread_affinity: 1
      gloo_timeout_seconds: 60
    logging:
      level: DEBUG
      with_timestamp: false
    """)


@pytest.fixture
def write_config(tmp_path):
    def write(text):
        path = tmp_path / "config.yaml"
        path.write_text(textwrap.dedent(text))
        return str(path)
    return write


def test_full_config_maps_to_env(write_config):
    path = write_config(FULL_CONFIG)
    args = launch.parse_args(["-np", "2", "--config-file", path, "cmd"])
    assert args.use_gloo is True
    env = config_parser.set_env_from_args({}, args)
    assert env == {
        "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "HOROVOD_CYCLE_TIME": "10.0",
        "HOROVOD_CACHE_CAPACITY": "2048",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "HOROVOD_HIERARCHICAL_ALLGATHER": "1",
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "horovod_autotune_log.txt",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "10",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.2",
        "HOROVOD_TIMELINE": "horovod_timeline.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "240",
        "HOROVOD_MPI_THREADS_DISABLE": "1",
        "HOROVOD_NUM_NCCL_STREAMS": "2",
        "HOROVOD_THREAD_AFFINITY": "1",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        "HOROVOD_LOG_LEVEL": "DEBUG",
        "HOROVOD_LOG_HIDE_TIME": "1",
    }


def test_file_overrides_earlier_flags_and_later_flags_win(write_config):
    path = write_config("""\
        params:
          fusion_threshold_mb: 32
          cycle_time_ms: 10
        stall_check:
          warning_time_seconds: 120
        """)
    args = launch.parse_args(["-np", "1", "--fusion-threshold-mb", "8", "--config-file", path,
                              "--cycle-time-ms", "3", "cmd"])
    assert args.fusion_threshold_mb == 32  # before --config-file: the file wins
    assert args.cycle_time_ms == 3  # after --config-file: the flag wins
    assert args.stall_check_warning_time_seconds == 120  # only in the file (over the flag's default)

    args = launch.parse_args(["-np", "1", "--config-file", path, "--stall-check-warning-time-seconds", "7",
                              "cmd"])
    assert args.stall_check_warning_time_seconds == 7


def test_bool_flags_before_and_after(write_config):
    path = write_config("""\
        params:
          hierarchical_allreduce: false
        stall_check:
          warning_time_seconds: 30
        """)
    args = launch.parse_args(["-np", "1", "--hierarchical-allreduce", "--no-stall-check", "--config-file", path,
                              "cmd"])
    assert args.hierarchical_allreduce is False
    assert args.no_stall_check is False  # a stall_check section without 'enabled' means enabled
    args = launch.parse_args(["-np", "1", "--config-file", path, "--hierarchical-allreduce", "--no-stall-check",
                              "cmd"])
    assert args.hierarchical_allreduce is True and args.no_stall_check is True


def test_autotune_section_without_enabled_disables_autotune(write_config):
    path = write_config("""\
        autotune:
          warmup_samples: 4
        """)
    args = launch.parse_args(["-np", "1", "--autotune", "--config-file", path, "cmd"])
    assert args.autotune is False and args.autotune_warmup_samples == 4
    args = launch.parse_args(["-np", "1", "--config-file", path, "--autotune", "cmd"])
    assert args.autotune is True


@pytest.mark.parametrize("controller, dest", [("gloo", "use_gloo"), ("mpi", "use_mpi"), ("jsrun", "use_jsrun")])
def test_controller(write_config, controller, dest):
    args = launch.parse_args(["-np", "1", "--config-file", write_config(f"controller: {controller}\n"), "cmd"])
    assert getattr(args, dest) is True


def test_controller_flag_wins_over_file(write_config):
    args = launch.parse_args(["-np", "1", "--gloo", "--config-file", write_config("controller: mpi\n"), "cmd"])
    assert args.use_gloo is True and args.use_mpi is False


@pytest.mark.parametrize("text, message", [
    ("controller: nccl\n", "No such controller"),
    ("params:\n  fusion_threshold_mb: lots\n", "params.fusion_threshold_mb"),
    ("autotune:\n  gaussian_process_noise: 2.0\n", "must be in"),
    ("logging:\n  level: LOUD\n", "logging.level"),
    ("- a\n- b\n", "mapping"),
    ("params: [\n", "not valid YAML"),
])
def test_bad_config_is_usage_error(write_config, capsys, text, message):
    with pytest.raises(SystemExit) as exc:
        launch.parse_args(["-np", "1", "--config-file", write_config(text), "cmd"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_config_file(capsys, tmp_path):
    with pytest.raises(SystemExit):
        launch.parse_args(["-np", "1", "--config-file", str(tmp_path / "nope.yaml"), "cmd"])
    assert "Cannot read --config-file" in capsys.readouterr().err


def test_unknown_keys_are_warned_and_ignored(write_config, caplog):
    with caplog.at_level(logging.WARNING):
        args = launch.parse_args(["-np", "1", "--config-file",
                                  write_config("params:\n  fusion_treshold_mb: 1\nextras:\n  a: 1\n"), "cmd"])
    assert args.fusion_threshold_mb is None
    assert "fusion_treshold_mb" in caplog.text and "extras" in caplog.text


def test_empty_config_file(write_config):
    assert launch.parse_args(["-np", "1", "--config-file", write_config(""), "cmd"]).fusion_threshold_mb is None


@pytest.mark.parametrize("text, value", [("yes", True), ("on", True), ("1", True), ("true", True), ("no", False),
                                         ("off", False), ("0", False), ("false", False)])
def test_booleans_in_the_file_use_the_one_parser(write_config, text, value):
    path = write_config(f"params:\n  torus_allreduce: {text}\nstall_check:\n  enabled: {text}\n")
    args = launch.parse_args(["-np", "1", "--config-file", path, "cmd"])
    assert args.torus_allreduce is value and args.no_stall_check is (not value)


def test_config_sections_come_from_the_option_table():
    assert list(config_parser.CONFIG_SECTIONS) == ["params", "autotune", "timeline", "stall_check",
                                                   "library_options", "logging"]
    assert {key: option.dest for key, (option, _) in config_parser.CONFIG_SECTIONS["stall_check"].items()} == {
        "enabled": "no_stall_check", "warning_time_seconds": "stall_check_warning_time_seconds",
        "shutdown_time_seconds": "stall_check_shutdown_time_seconds"}
