"""Elastic training's worker side through the numpy binding, at any number of ranks without the driver:
ObjectState syncs from rank 0, and ``hvd.elastic.run`` restores the last commit and re-forms the job in place
(``shutdown()`` then ``init()`` on the same ranks) after a failed collective, or keeps the step after an
announced change of hosts."""
import time

import numpy as np

import horovod.numpy as hvd
from horovod.common.elastic import HostUpdateResult, notification_manager
from horovod.common.exceptions import HorovodInternalError


def test_object_state_syncs_from_rank_0():
    state = hvd.elastic.ObjectState(epoch=hvd.rank(), weights=np.full(3, float(hvd.rank())))
    state.sync()
    assert state.epoch == 0 and np.array_equal(state.weights, np.zeros(3))


def test_run_restores_after_a_failure_and_keeps_the_step_after_a_host_update():
    state = hvd.elastic.ObjectState(step=0)
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.step)
        state.step += 1
        state.commit()
        if len(attempts) == 1:
            state.step = 50                          # uncommitted: lost
            raise HorovodInternalError("simulated: a rank was lost")
        if len(attempts) == 2 and hvd.rank() == 0:
            # The driver tells rank 0 that hosts were added; the next commit raises on every rank at once, after
            # saving, so the step just taken is kept.
            notification_manager.handle_hosts_updated(time.time(), HostUpdateResult.added)
        state.step += 1
        state.commit()
        return hvd.allreduce(np.array([float(state.step)]), op=hvd.Sum, name="elastic.after")[0]

    # attempt 1: 0 -> 1 committed, 50 lost; attempt 2: 1 -> 2 -> 3, committed as the update is raised;
    # attempt 3 starts from 3 (kept across the update) and ends at 5.
    assert train(state) == 5.0 * hvd.size()
    assert attempts == [0, 1, 3] and hvd.is_initialized()
