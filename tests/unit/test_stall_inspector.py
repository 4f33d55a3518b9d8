"""The stall inspector's decisions, on a fake clock."""
import logging

import pytest

from horovod.common.stall_inspector import StallInspector, from_config


def test_no_warning_before_the_check_time(caplog):
    inspector = StallInspector(3, warning_s=10)
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        assert inspector.check([("t", 100.0, [0, 2])], [], now=109.0) is None
    assert not caplog.records


def test_warning_names_missing_ranks_tensors_and_wait_then_repeats_each_period(caplog):
    inspector = StallInspector(4, warning_s=10)
    pending = [("a", 100.0, [0, 2]), ("b", 95.0, [0, 1, 2])]
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        assert inspector.check(pending, [], now=111.0) is None
        assert inspector.check(pending, [], now=112.0) is None      # already warned this period
        assert inspector.check(pending, [], now=121.5) is None      # one period later: again
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    lines = messages[0].splitlines()
    assert "waiting for remainder of ranks for more than 10 seconds" in lines[0]
    assert lines[1] == "Missing ranks:"
    assert lines[2] == "1: [a (waiting 11.0 s)]"
    assert lines[3] == "3: [b (waiting 16.0 s), a (waiting 11.0 s)]"


def test_joined_ranks_are_not_missing(caplog):
    inspector = StallInspector(3, warning_s=1)
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        inspector.check([("t", 0.0, [0])], joined=[2], now=5.0)
    text = caplog.records[0].getMessage()
    assert "1: [t (waiting 5.0 s)]" in text and "2: [" not in text


def test_at_most_five_names_per_rank(caplog):
    inspector = StallInspector(2, warning_s=1)
    pending = [(f"t{i}", 0.0 - i, [0]) for i in range(7)]
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        inspector.check(pending, [], now=5.0)
    line = caplog.records[0].getMessage().splitlines()[2]
    assert line.startswith("1: [t6 (waiting 11.0 s), t5") and line.endswith("and 2 more]"), line


def test_shutdown_message_marks_the_rank_and_says_what_to_do():
    inspector = StallInspector(2, warning_s=1, shutdown_s=3)
    assert inspector.check([("t", 0.0, [0])], [], now=2.0) is None
    message = inspector.check([("t", 0.0, [0])], [], now=3.5)
    assert message is not None
    assert "1!: [t (waiting 3.5 s)]" in message
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3" in message and "Make every rank submit" in message


def test_shutdown_time_below_the_check_time_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        inspector = StallInspector(2, warning_s=10, shutdown_s=5)
    assert inspector.shutdown_s == 0
    assert "is ignored" in caplog.records[0].getMessage()
    assert inspector.check([("t", 0.0, [0])], [], now=100.0) is None


def test_check_interval_follows_the_warning_time():
    assert StallInspector(2, warning_s=60).interval == 1.0
    assert StallInspector(2, warning_s=1).interval == 0.25
    inspector = StallInspector(2, warning_s=2)
    inspector.check([], [], now=10.0)
    assert inspector.due_in(10.2) == pytest.approx(0.3)


def test_from_config(monkeypatch):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    assert from_config(2) is None
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "0")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "7")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9")
    inspector = from_config(2)
    assert (inspector.warning_s, inspector.shutdown_s) == (7, 9)
