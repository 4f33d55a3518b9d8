"""Log records as a user sees them: the level from --log-level/HOROVOD_LOG_LEVEL, the rank on every record,
and timestamps unless --log-without-timestamp."""
import re
import sys

import pytest

from tests.support.launch import horovodrun, rank_lines

pytestmark = pytest.mark.timeout(120)
PROGRAM = [sys.executable, "-c", "import horovod.numpy as hvd; hvd.init(); hvd.shutdown()"]
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] "


def init_lines(output, rank):
    return [line for line in rank_lines(output, rank) if "Horovod initialized" in line]


def test_info_records_carry_the_rank_and_a_timestamp():
    result = horovodrun(2, PROGRAM, extra_args=["--log-level", "INFO"], timeout=60)
    assert result.returncode == 0, result.stdout[-3000:]
    for r in range(2):
        lines = init_lines(result.stdout, r)
        assert lines and re.match(STAMP + rf"\[horovod INFO rank {r}\] Horovod initialized: rank {r} of 2", lines[0]), \
            result.stdout[-3000:]


def test_without_timestamp():
    result = horovodrun(2, PROGRAM, extra_args=["--log-level", "INFO", "--log-without-timestamp"], timeout=60)
    lines = init_lines(result.stdout, 1)
    assert lines and lines[0].startswith("[horovod INFO rank 1] Horovod initialized"), result.stdout[-3000:]


@pytest.mark.parametrize("level,shown", [("TRACE", True), ("DEBUG", True), ("WARNING", False), ("FATAL", False)])
def test_levels_from_trace_to_fatal(level, shown):
    result = horovodrun(2, PROGRAM, env={"HOROVOD_LOG_LEVEL": level}, timeout=60)
    assert result.returncode == 0, result.stdout[-3000:]
    assert bool(init_lines(result.stdout, 0)) is shown, result.stdout[-3000:]


def test_unknown_level_is_refused_with_the_choices():
    result = horovodrun(1, PROGRAM, env={"HOROVOD_LOG_LEVEL": "LOUD"}, timeout=60)
    assert result.returncode != 0
    assert "choose one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL" in result.stdout, result.stdout[-3000:]
