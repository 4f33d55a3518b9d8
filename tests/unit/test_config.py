"""Every HOROVOD_* knob: declared once, typed, with upstream's default; bad values name the variable."""
import logging

import pytest

from horovod.common import config


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in config.KNOBS:
        monkeypatch.delenv(name, raising=False)


UPSTREAM_DEFAULTS = {
    "HOROVOD_FUSION_THRESHOLD": 128 * 1024 * 1024,
    "HOROVOD_CYCLE_TIME": 1.0,
    "HOROVOD_CACHE_CAPACITY": 1024,
    "HOROVOD_HIERARCHICAL_ALLREDUCE": False,
    "HOROVOD_HIERARCHICAL_ALLGATHER": False,
    "HOROVOD_TORUS_ALLREDUCE": False,
    "HOROVOD_DISABLE_GROUP_FUSION": False,
    "HOROVOD_AUTOTUNE": False,
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": 3,
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": 10,
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": 20,
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": 0.8,
    "HOROVOD_TIMELINE_MARK_CYCLES": False,
    "HOROVOD_STALL_CHECK_DISABLE": False,
    "HOROVOD_STALL_CHECK_TIME_SECONDS": 60.0,
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": 0.0,
    "HOROVOD_MPI_THREADS_DISABLE": False,
    "HOROVOD_NUM_NCCL_STREAMS": 1,
    "HOROVOD_GLOO_TIMEOUT_SECONDS": 30.0,
    "HOROVOD_ELASTIC": False,
    "HOROVOD_DYNAMIC_PROCESS_SETS": False,
    "HOROVOD_ENABLE_ASYNC_COMPLETION": False,
    "HOROVOD_ENABLE_XLA_OPS": False,
    "HOROVOD_BATCH_D2D_MEMCOPIES": True,
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": 1 << 30,
    "HOROVOD_LOG_LEVEL": "WARNING",
    "HOROVOD_LOG_HIDE_TIME": False,
    "HOROVOD_START_TIMEOUT": 30.0,
    "HOROVOD_ELASTIC_TIMEOUT": 600.0,
}


@pytest.mark.parametrize("name,default", list(UPSTREAM_DEFAULTS.items()))
def test_upstream_defaults(name, default):
    assert config.get(name) == default
    assert type(config.get(name)) is type(default)


def test_unset_string_knobs_are_empty():
    for name in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                 "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_THREAD_AFFINITY"):
        assert config.get(name) == ""
    assert config.get("HOROVOD_GLOO_RENDEZVOUS_PORT") == 0


def test_our_knobs_are_marked_and_documented():
    ours = {k.name for k in config.KNOBS.values() if k.ours}
    assert {"HOROVOD_SHM_CHUNK_BYTES", "HOROVOD_TCP_SMALL_BYTES", "HOROVOD_SPIN_MICROSECONDS"} <= ours
    assert not ours & set(UPSTREAM_DEFAULTS)
    assert config.get("HOROVOD_SHM_CHUNK_BYTES") == 4 * 1024 * 1024
    assert config.get("HOROVOD_TCP_SMALL_BYTES") == 64 * 1024
    for knob in config.KNOBS.values():
        assert knob.name.startswith("HOROVOD_") and knob.doc


def test_every_knob_default_parses_from_its_own_text():
    for knob in config.KNOBS.values():
        if isinstance(knob.default, bool):
            assert knob.parse("1" if knob.default else "0") is knob.default
        elif knob.default not in ("", None):
            assert knob.parse(str(knob.default)) == knob.default, knob.name


def test_values_are_typed(monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "4194304")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "0")
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "tcp")
    monkeypatch.setenv("HOROVOD_LOG_LEVEL", "debug")
    assert config.get("HOROVOD_FUSION_THRESHOLD") == 4194304
    assert config.get("HOROVOD_CYCLE_TIME") == 2.5
    assert config.get("HOROVOD_CACHE_CAPACITY") == 0
    assert config.get("HOROVOD_CPU_OPERATIONS") == "TCP"
    assert config.get("HOROVOD_LOG_LEVEL") == "DEBUG"


@pytest.mark.parametrize("text,value", [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False),
                                        ("false", False), ("No", False), ("off", False)])
def test_booleans(monkeypatch, text, value):
    monkeypatch.setenv("HOROVOD_AUTOTUNE", text)
    assert config.get("HOROVOD_AUTOTUNE") is value


def test_empty_value_means_default(monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "")
    assert config.get("HOROVOD_CYCLE_TIME") == 1.0
    assert not config.is_set("HOROVOD_CYCLE_TIME")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3")
    assert config.is_set("HOROVOD_CYCLE_TIME")


@pytest.mark.parametrize("name,bad", [("HOROVOD_FUSION_THRESHOLD", "64MB"), ("HOROVOD_CYCLE_TIME", "fast"),
                                      ("HOROVOD_CACHE_CAPACITY", "1.5"), ("HOROVOD_AUTOTUNE", "maybe"),
                                      ("HOROVOD_SHM_CHUNK_BYTES", "big"), ("HOROVOD_START_TIMEOUT", "soon")])
def test_invalid_value_names_the_variable(monkeypatch, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError) as info:
        config.get(name)
    assert name in str(info.value) and bad in str(info.value)


def test_unknown_knob_is_a_programming_error():
    with pytest.raises(KeyError):
        config.get("HOROVOD_NO_SUCH_KNOB")
    with pytest.raises(KeyError):
        config.is_set("HOROVOD_NO_SUCH_KNOB")


@pytest.mark.parametrize("value,expected", [
    (True, True), (False, False), (1, True), (0, False), ("1", True), ("0", False), ("true", True),
    ("FALSE", False), ("yes", True), ("no", False), ("on", True), ("off", False), ("y", True), ("n", False),
    ("t", True), ("f", False), (" True ", True), ("", False)])
def test_one_boolean_parser_accepts_every_spelling(value, expected):
    assert config.parse_bool(value) is expected


@pytest.mark.parametrize("value", ["maybe", 2, 1.0, None, [1]])
def test_one_boolean_parser_rejects_the_rest(value):
    with pytest.raises(ValueError, match="must be a boolean"):
        config.parse_bool(value)


def test_get_and_is_set_read_a_given_mapping(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "7")
    env = {"HOROVOD_RANK": "3", "HOROVOD_HOSTNAME": ""}
    assert config.get("HOROVOD_RANK", env) == 3 and config.get("HOROVOD_RANK") == 7
    assert config.is_set("HOROVOD_RANK", env) and not config.is_set("HOROVOD_SIZE", env)
    assert not config.is_set("HOROVOD_HOSTNAME", env) and config.get("HOROVOD_HOSTNAME", env) == ""
    with pytest.raises(ValueError, match="HOROVOD_SIZE"):
        config.get("HOROVOD_SIZE", {"HOROVOD_SIZE": "two"})


INERT = {"HOROVOD_NUM_NCCL_STREAMS",
         "HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_ENABLE_XLA_OPS",
         "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_ADASUM_MPI_CHUNK_SIZE",
         "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_TORUS_ALLREDUCE"}


def test_inert_knobs_say_they_have_no_effect():
    assert {k.name for k in config.KNOBS.values() if k.inert} == INERT
    for knob in config.KNOBS.values():
        assert ("accepted, no effect" in knob.doc.lower()) is knob.inert, knob.name


@pytest.fixture
def fresh_inert_log(monkeypatch):
    """A process that has logged no inert knob yet, its records reaching caplog even after an init in the same
    process made the ``horovod`` logger stop propagating."""
    monkeypatch.setattr(config, "_inert_logged", set())
    monkeypatch.setattr(logging.getLogger("horovod"), "propagate", True)


def test_an_inert_knob_that_is_set_is_logged_once_at_debug(monkeypatch, caplog, fresh_inert_log):
    monkeypatch.setenv("HOROVOD_NUM_NCCL_STREAMS", "2")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3")  # not inert: never logged
    with caplog.at_level(logging.DEBUG, logger="horovod.common.config"):
        config.log_inert_knobs()
        config.log_inert_knobs()
    records = [r for r in caplog.records if r.name == "horovod.common.config"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert "HOROVOD_NUM_NCCL_STREAMS" in records[0].getMessage()
    assert "no effect" in records[0].getMessage()


def test_unset_inert_knobs_are_not_logged(caplog, fresh_inert_log):
    with caplog.at_level(logging.DEBUG, logger="horovod.common.config"):
        config.log_inert_knobs()
        config.log_inert_knobs({"HOROVOD_TORUS_ALLREDUCE": ""})
    assert not [r for r in caplog.records if r.name == "horovod.common.config"]
    with caplog.at_level(logging.DEBUG, logger="horovod.common.config"):
        config.log_inert_knobs({"HOROVOD_TORUS_ALLREDUCE": "1"})
    assert "HOROVOD_TORUS_ALLREDUCE" in caplog.text


def test_alike_values_compare_what_the_settings_mean():
    """``1`` and ``true`` mean the same; an unset HOROVOD_HIERARCHICAL_ALLREDUCE (hierarchical across hosts) is not
    an explicit ``0`` (one flat ring), though both parse to False."""
    on, true = config.alike_values({"HOROVOD_FAST_ROUNDS": "1"}), config.alike_values({"HOROVOD_FAST_ROUNDS": "true"})
    assert on == true and on["HOROVOD_FAST_ROUNDS"] == "True"
    assert config.alike_values({})["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "unset"
    assert config.alike_values({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"})["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "False"
    assert "HOROVOD_CYCLE_TIME" not in on          # the coordinator's own choice: ranks may differ
    assert config.disagreement([on, true, config.alike_values({})]) is None


def test_a_disagreement_names_each_setting_and_which_ranks_have_which_value():
    base = config.alike_values({})
    odd = config.alike_values({"HOROVOD_FAST_ROUNDS": "0", "HOROVOD_TCP_CHUNK_BYTES": "65536"})
    message = config.disagreement([base, odd, base, None], ["a", "b", "a", "c"])
    assert message.startswith("These settings differ between the ranks of this job")
    assert "HOROVOD_FAST_ROUNDS: ranks 0, 2 (host a) have True; rank 1 (host b) has False" in message
    assert "HOROVOD_TCP_CHUNK_BYTES: ranks 0, 2 (host a) have 1048576; rank 1 (host b) has 65536" in message
    assert "HOROVOD_CACHE_CAPACITY" not in message and "rank 3" not in message     # alike, and sent nothing
    assert "export each with -x NAME" in message
