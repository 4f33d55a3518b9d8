"""The elastic worker API on one process: State's host-update protocol, ObjectState's commit/restore/sync, and
run_fn's loop (restore after a failed collective, keep the step after an announced change of hosts)."""
import pytest

from horovod.common import elastic
from horovod.common.elastic import HostUpdateResult, ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class Rank0:
    """A broadcast from rank 0 in a one-rank job: returns the object, and counts the calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, obj):
        self.calls.append(obj)
        return obj


def make_state(**kwargs):
    bcast = Rank0()
    return ObjectState(bcast, lambda: 0, **kwargs), bcast


def test_object_state_commit_restore_sync():
    state, bcast = make_state(epoch=0, batch=5)
    assert (state.epoch, state.batch) == (0, 5)
    state.epoch, state.batch = 1, 7
    state.commit()
    state.epoch = 99
    state.restore()
    assert (state.epoch, state.batch) == (1, 7)
    state.sync()
    assert bcast.calls[-1] == {"epoch": 1, "batch": 7}


def test_object_state_restores_containers_changed_in_place():
    state, _ = make_state(seen={0: [1, 2]}, losses=[0.5])
    state.commit()
    state.seen[0].append(3)                         # in place, after the commit
    state.losses.append(0.4)
    state.restore()
    assert state.seen == {0: [1, 2]} and state.losses == [0.5]
    state.losses.append(0.3)                        # the restored copy is not the commit itself
    state.restore()
    assert state.losses == [0.5]


def test_no_host_update_raises_nothing_but_still_agrees_with_rank_0():
    state, bcast = make_state(x=1)
    state.check_host_updates()
    assert bcast.calls == [(0, 0, HostUpdateResult.no_update)]
    assert state._last_updated_timestamp == 0


@pytest.mark.parametrize("updates,skip_sync", [
    ([(1.0, HostUpdateResult.removed)], True),
    ([(1.0, HostUpdateResult.added)], False),
    ([(1.0, HostUpdateResult.removed), (2.0, HostUpdateResult.added)], False),     # mixed: sync again
])
def test_announced_updates_raise_once_with_skip_sync_only_for_removals(updates, skip_sync):
    state, _ = make_state(x=1)
    for timestamp, result in updates:
        state.on_hosts_updated(timestamp, result)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync is skip_sync
    assert state._last_updated_timestamp == updates[-1][0]
    state.check_host_updates()                      # the same notices do not raise twice
    state.on_hosts_updated(updates[0][0], HostUpdateResult.added)      # nor does an older one
    state.check_host_updates()


def test_the_decision_is_rank_0s():
    """Rank 0's broadcast decides: a rank that saw no notice still raises when rank 0 did."""
    state = ObjectState(lambda obj: (0, 5.0, HostUpdateResult.added), lambda: 1, x=1)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()


def test_reset_forgets_notices_and_runs_callbacks():
    state, _ = make_state(x=1)
    seen = []
    state.register_reset_callbacks([lambda: seen.append("a"), lambda: seen.append("b")])
    state.on_hosts_updated(1.0, HostUpdateResult.added)
    state.on_reset()
    assert seen == ["a", "b"]
    state.check_host_updates()                      # the notice was dropped by the reset


def test_run_fn_restores_after_a_failed_collective_and_keeps_the_step_after_a_host_update():
    state, bcast = make_state(step=0)
    resets, attempts = [], []

    def train(state):
        attempts.append(state.step)
        if len(attempts) == 1:
            state.step = 3
            state.commit()
            state.step = 4                          # uncommitted: lost by the failure below
            raise HorovodInternalError("rank 1 was lost")
        if len(attempts) == 2:
            state.step = 5
            state.commit()                          # saves, then the announced change interrupts: nothing lost
            raise HostsUpdatedInterrupt(skip_sync=True)
        return state.step

    assert run_fn(train, lambda: resets.append(1))(state) == 5
    assert attempts == [0, 3, 5] and len(resets) == 2
    syncs = [c for c in bcast.calls if isinstance(c, dict)]
    # Synced after every reset, also after a removal (skip_sync): survivors and workers that just started must
    # agree on whether to sync (upstream's #3494), and the survivors' states are equal anyway.
    assert syncs == [{"step": 0}, {"step": 3}, {"step": 5}]
    assert state not in elastic.notification_manager._listeners


def test_the_notification_manager_reaches_registered_states():
    state, _ = make_state(x=1)
    manager = elastic.WorkerNotificationManager()
    started = []
    manager.starter = started.append
    manager.init()
    manager.init()
    assert started == [manager]                     # started once
    manager.register_listener(state)
    manager.handle_hosts_updated(3.0, HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync
    manager.remove_listener(state)
    manager.handle_hosts_updated(4.0, HostUpdateResult.added)
    state.check_host_updates()


def test_run_fn_does_not_retry_when_the_ranks_disagree():
    """A mismatch is the program's mistake: re-forming the job would meet it again, forever."""
    state, _ = make_state(step=0)
    resets = []

    def train(state):
        raise HorovodInternalError("Mismatched allreduce tensor shapes: rank 0 sent [2], rank 1 sent [3] "
                                   "(tensor: allreduce.grad)")

    with pytest.raises(HorovodInternalError, match="Mismatched allreduce tensor shapes"):
        run_fn(train, lambda: resets.append(1))(state)
    assert resets == []
