"""Runs inside every rank of a parallel test job: init Horovod once, dump stacks on SIGUSR1."""
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
