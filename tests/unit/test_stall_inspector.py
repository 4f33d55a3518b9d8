"""The stall inspector's decisions, on a fake clock."""
import logging

import pytest

from horovod.core.observers.stall_inspector import (
    REPORT,
    SHUTDOWN,
    DeadlockDetector,
    StallInspector,
    deadlock_from_config,
    from_config,
    lapse_seconds,
)


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


# ------------------------------------------------------------------ deadlock detector
# (name, op type, ranks that submitted, ranks blocked waiting on it), as Coordinator.waits() gives them.
CROSSED = [("barrier.noname", "BARRIER", [0], [0]), ("grad", "REDUCESCATTER", [1, 2], [1, 2])]


def run(detector, waits, times, joined=(), ready=False, progress=7, several_threads=()):
    """Check at each time; the verdicts that were not None."""
    out = []
    for now in times:
        verdict = detector.check(waits, joined, ready, progress, now, several_threads=several_threads)
        if verdict is not None:
            out.append((now, *verdict))
    return out


def test_a_crossed_wait_is_reported_after_the_window_naming_what_each_rank_waits_on():
    detector = DeadlockDetector(3, confirm_s=2.0, shutdown_s=5.0)
    verdicts = run(detector, CROSSED, [10.0, 11.0, 11.9])
    assert verdicts == []                                   # held 1.9 s < 2 s
    (now, kind, message), = run(detector, CROSSED, [12.0])
    assert kind == REPORT
    lines = message.splitlines()
    assert lines[0].startswith("Deadlock: every rank is blocked") and "for 2.0 s" in lines[0]
    assert lines[1] == "Rank 0 waits on barrier.noname (BARRIER; not submitted by ranks 1, 2)."
    assert lines[2] == "Rank 1 waits on grad (REDUCESCATTER; not submitted by rank 0)."
    assert lines[3] == "Rank 2 waits on grad (REDUCESCATTER; not submitted by rank 0)."
    assert "same collectives in the same order" in lines[4]
    assert "The job ends in 5 s" in lines[5] and "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE=1" in lines[5]


def test_the_job_ends_a_grace_period_after_the_report_with_the_report_in_the_message():
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=3.0)
    verdicts = run(detector, CROSSED, [0.0, 1.0, 2.0, 3.9, 4.0, 4.5, 9.0])
    assert [(t, kind) for t, kind, _ in verdicts] == [(1.0, REPORT), (4.0, SHUTDOWN)]
    message = verdicts[1][2]
    assert "Rank 0 waits on barrier.noname (BARRIER; not submitted by ranks 1, 2)." in message
    assert "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS=3" in message.splitlines()[-1]


def test_report_only_never_ends_the_job():
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=1.0, shutdown=False)
    verdicts = run(detector, CROSSED, [0.0, 1.0, 5.0, 50.0])
    assert [(t, kind) for t, kind, _ in verdicts] == [(1.0, REPORT)]
    assert "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE is set" in verdicts[0][2]


def test_a_rank_submitting_from_several_threads_is_reported_but_the_job_not_ended():
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=1.0)
    verdicts = run(detector, CROSSED, [0.0, 1.0, 5.0, 50.0], several_threads={2})
    assert [(t, kind) for t, kind, _ in verdicts] == [(1.0, REPORT)]
    assert "Rank 2 submit collectives from several threads" in verdicts[0][2]
    assert "the job is not ended" in verdicts[0][2]
    # A rank that only ever waited from one thread does not hold off the ending; a joined one is not blocked.
    other = DeadlockDetector(3, confirm_s=1.0, shutdown_s=1.0)
    assert [kind for _, kind, _ in run(other, CROSSED[1:], [0.0, 1.0, 2.0], joined={0}, several_threads={0})] == \
        [REPORT, SHUTDOWN]


def test_a_new_submission_or_emission_restarts_the_window():
    detector = DeadlockDetector(3, confirm_s=2.0, shutdown_s=5.0)
    assert run(detector, CROSSED, [0.0, 1.5], progress=1) == []
    assert run(detector, CROSSED, [1.6], progress=2) == []      # another thread submitted something
    assert run(detector, CROSSED, [3.5], progress=2) == []      # 1.9 s since then
    assert [kind for _, kind, _ in run(detector, CROSSED, [3.6], progress=2)] == [REPORT]


def test_progress_after_the_report_calls_off_the_ending(caplog):
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=2.0)
    assert [kind for _, kind, _ in run(detector, CROSSED, [0.0, 1.0])] == [REPORT]
    with caplog.at_level(logging.WARNING, "horovod.stall"):
        assert run(detector, CROSSED, [2.0], progress=8) == []
    assert "resolved" in caplog.records[-1].getMessage()
    assert run(detector, CROSSED, [2.5], progress=8) == []
    # A new window: when the old report's grace period is over, the state is reported afresh, not ended.
    assert [kind for _, kind, _ in run(detector, CROSSED, [3.0], progress=8)] == [REPORT]


def test_no_deadlock_while_some_rank_is_not_waiting():
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=1.0)
    rank2_busy = [("barrier.noname", "BARRIER", [0], [0]), ("grad", "REDUCESCATTER", [1, 2], [1])]
    assert run(detector, rank2_busy, [0.0, 5.0, 50.0]) == []


def test_no_deadlock_while_a_tensor_is_ready_or_when_nobody_waits():
    detector = DeadlockDetector(3, confirm_s=1.0, shutdown_s=1.0)
    assert run(detector, CROSSED, [0.0, 5.0, 50.0], ready=True) == []
    assert run(DeadlockDetector(3, 1.0, 1.0), [], [0.0, 5.0, 50.0]) == []


def test_joined_ranks_are_not_expected_to_wait():
    waits = [("a", "ALLREDUCE", [1], [1]), ("b", "ALLREDUCE", [2], [2])]
    assert run(DeadlockDetector(3, 1.0, 1.0), waits, [0.0, 5.0]) == []       # rank 0 is busy
    (_, kind, message), = run(DeadlockDetector(3, 1.0, 1.0), waits, [0.0, 5.0], joined=[0])
    assert kind == REPORT and "Rank 0 waits" not in message
    assert "Rank 1 waits on a (ALLREDUCE; not submitted by rank 2)." in message
    assert "Rank 0 joined (hvd.join): it counts as having submitted every tensor." in message


def test_a_group_member_every_rank_submitted_is_described_as_held_for_its_group():
    waits = [("g_0of2", "ALLREDUCE", [0, 1], [0, 1]), ("g_1of2", "ALLREDUCE", [0], [0, 1])]
    (_, _, message), = run(DeadlockDetector(2, 1.0, 1.0), waits, [0.0, 1.0])
    assert ("Rank 1 waits on g_0of2 (ALLREDUCE; submitted by every rank, held for the rest of its group), "
            "g_1of2 (ALLREDUCE; not submitted by rank 1).") in message


def test_at_most_five_names_per_waiting_rank():
    waits = [(f"t{i}", "ALLREDUCE", [0], [0]) for i in range(7)] + [("u", "ALLREDUCE", [1], [1])]
    (_, _, message), = run(DeadlockDetector(2, 1.0, 1.0), waits, [0.0, 1.0])
    line = [x for x in message.splitlines() if x.startswith("Rank 0")][0]
    assert line.startswith("Rank 0 waits on t0 (ALLREDUCE") and line.endswith("t4 (ALLREDUCE; not submitted by "
                                                                               "rank 1) and 2 more."), line


def test_check_interval_follows_the_window():
    assert DeadlockDetector(2, confirm_s=5.0, shutdown_s=5.0).interval == 0.5
    assert DeadlockDetector(2, confirm_s=0.4, shutdown_s=5.0).interval == pytest.approx(0.1)
    assert DeadlockDetector(2, confirm_s=0.0, shutdown_s=5.0).interval == 0.05


def test_deadlock_from_config(monkeypatch):
    for name in ("HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_DEADLOCK_CHECK_DISABLE", "HOROVOD_DEADLOCK_CHECK_TIME_SECONDS",
                 "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS",
                 "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    detector = deadlock_from_config(2)
    assert (detector.confirm_s, detector.shutdown_s, detector.shutdown) == (5.0, 5.0, True)
    assert lapse_seconds() == 0.5
    assert deadlock_from_config(1) is None
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "2")        # reported within the stall check time
    monkeypatch.setenv("HOROVOD_DEADLOCK_SHUTDOWN_DISABLE", "1")
    detector = deadlock_from_config(4)
    assert (detector.confirm_s, detector.shutdown) == (2.0, False)
    assert lapse_seconds() == 0.5
    monkeypatch.setenv("HOROVOD_DEADLOCK_CHECK_TIME_SECONDS", "0.2")
    assert lapse_seconds() == pytest.approx(0.05)
    monkeypatch.setenv("HOROVOD_DEADLOCK_CHECK_DISABLE", "1")
    assert deadlock_from_config(2) is None
    monkeypatch.setenv("HOROVOD_DEADLOCK_CHECK_DISABLE", "0")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")             # no inspection at all, as upstream
    assert deadlock_from_config(2) is None
