"""The static Ray executor's first failure: a dead actor found within the grace period is named as the cause, not
the rank whose collective failed because that actor vanished (seen once in CI: rank 0's HorovodInternalError
reached the driver before Ray reported rank 1's actor dead)."""
import types

import pytest

ray = pytest.importorskip("ray")

from horovod.ray.static import StaticAdapter  # noqa: E402


class _Adapter:
    """What StaticAdapter._failed reads of its adapter: two workers, and shutdown()."""

    def __init__(self):
        self.workers = [types.SimpleNamespace(slot=types.SimpleNamespace(rank=r, hostname=f"node-{r}"), node_id=None)
                        for r in range(2)]
        self.stopped = False

    def shutdown(self):
        self.stopped = True


def test_a_dead_actor_reported_after_its_peers_error_is_named_as_the_cause(monkeypatch):
    peer_error = ray.exceptions.RayTaskError("fn", "Traceback: HorovodInternalError: Rank 1 closed its connection",
                                             RuntimeError("Rank 1 closed its connection"))
    outcomes = {"ref-of-rank-1": ray.exceptions.RayActorError()}
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout=None: (list(refs), []))

    def get(ref):
        raise outcomes[ref]

    monkeypatch.setattr(ray, "get", get)
    adapter = _Adapter()
    error = StaticAdapter._failed(adapter, peer_error, 0, {"ref-of-rank-1": 1}, "the function")
    assert error.rank == 1 and "actor of rank 1" in str(error) and adapter.stopped
