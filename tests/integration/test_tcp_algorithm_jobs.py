"""Every tcp allreduce and broadcast algorithm, forced by its knob, in real jobs of 3 and 8 ranks on localhost.

One job per rank count (the worker re-initializes Horovod once per algorithm, so each start-up is paid once):
about 1.5 s at 3 ranks and 5 s at 8 on a 2-core machine.
"""
import sys
from pathlib import Path

import pytest

from tests.support.launch import horovodrun, rank_lines

WORKER = Path(__file__).parent / "workers" / "tcp_algorithms.py"

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("np_", [3, 8])
def test_every_tcp_algorithm_forced_by_its_knob(np_):
    # many pipeline chunks; small blocking allreduces on the data plane too (not reduced by the coordinator)
    env = {"HOROVOD_CPU_OPERATIONS": "tcp", "HOROVOD_TCP_CHUNK_BYTES": "65536", "HOROVOD_COORDINATOR_CARRY_BYTES": "0"}
    result = horovodrun(np_, [sys.executable, str(WORKER)], env=env, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    for rank in range(np_):
        assert any(line.startswith("TCP_ALGORITHMS_OK") for line in rank_lines(result.stdout, rank)), \
            result.stdout[-4000:]
