"""What the in-process fast-round tests share: an engine for a round (``fast_rounds.Parking``), and every rank's
side run in a thread of its own."""
import threading
from typing import Callable

from horovod.core.engine.state import EngineState


class RunningEngine:
    """An engine that runs and never spins (a waiter sleeps on the doorbell at once) and ignores parks."""

    state = EngineState.RUNNING
    error = None
    spin_s = 0.0

    def park(self, entry, since):
        pass

    def unpark(self, entry):
        pass


def each_rank_in_a_thread(ranks: int, run: Callable[[int], None], what: str = "a round") -> None:
    """``run(r)`` for every rank ``r``, each in a thread, all at once; fails the test when one has not returned
    within 10 s (its round did not close)."""
    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), f"{what} did not close"


def fast_round_count():
    """In a parallel job: (the global set's fast rounds so far, whether they are counted: its blocking rounds are
    fast rounds and still unsealed; a join earlier in the job seals them, and every op then goes through the
    coordinator)."""
    from horovod.core import basics, ops
    from horovod.core.engine.fast_rounds import SEALED

    fast = basics.engine_for(None).fast
    if fast is None or not ops.has_fast_rounds():
        return 0, False
    return fast.matched, not (fast.off or any(words[SEALED] for words in fast.words))
