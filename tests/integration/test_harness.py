"""The multi-rank harness itself: a hung job is killed at its timeout and reports every rank's stack."""
import sys

import pytest

from tests.support.launch import ROOT, RanksHung, horovodrun


@pytest.mark.slow
def test_timeout_dumps_the_stacks_of_hung_ranks():
    with pytest.raises(RanksHung) as info:
        horovodrun(2, [sys.executable, str(ROOT / "tests" / "integration" / "workers" / "hang.py")], timeout=8)
    report = str(info.value)
    assert "did not finish within 8s" in report
    # faulthandler's dump, forwarded with each rank's prefix: rank 0 waits in the handle, rank 1 sleeps.
    assert "[0]<stderr>:" in report and "[1]<stderr>:" in report, report[-4000:]
    rank0 = "\n".join(line for line in report.splitlines() if line.startswith("[0]<stderr>:"))
    rank1 = "\n".join(line for line in report.splitlines() if line.startswith("[1]<stderr>:"))
    # Rank 0 is blocked inside its allreduce: in a handle's wait, or (one host, a blocking call) in its fast round.
    assert "in allreduce" in rank0 and "hang.py" in rank0, rank0[-3000:]
    assert "in wait" in rank0 or "in _wait_for_round" in rank0, rank0[-3000:]
    assert "rank1_sleeps_forever" in rank1, rank1[-3000:]
