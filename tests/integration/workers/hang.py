"""Rank 0 waits in an allreduce that rank 1 never joins (rank 1 sleeps): a deliberate hang for the harness."""
import faulthandler
import signal
import sys
import time

import numpy as np

import horovod.numpy as hvd

faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def rank1_sleeps_forever():
    while True:
        time.sleep(1)


def main():
    hvd.init()
    print("ready", flush=True)
    if hvd.rank() == 1:
        rank1_sleeps_forever()
    hvd.allreduce(np.ones(4), name="never.joined")


if __name__ == "__main__":
    main()
