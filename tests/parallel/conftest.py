"""Runs inside every rank of a parallel test job: init Horovod once, dump stacks on SIGUSR1, and start every file
from the same state of unnamed-tensor numbering.

A job may run several files (the suites run one job per rank count). Some bodies submit different numbers of
unnamed collectives on different ranks on purpose (join with uneven work), after which the ranks'
``<op>.noname.<n>`` numbers differ, as they would in upstream's Horovod; each file then starts afresh, as it did
in a process of its own. (Unnamed collectives on process sets are numbered per set, so they cannot cause this.)
"""
import faulthandler
import signal
import sys

import pytest

faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


@pytest.fixture(scope="session", autouse=True)
def horovod_session():
    import horovod.numpy as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(scope="module", autouse=True)
def fresh_unnamed_tensor_numbers(horovod_session):
    from horovod.core import ops

    horovod_session.barrier()           # every rank is done with the previous file's collectives
    ops._counters.clear()
    yield
