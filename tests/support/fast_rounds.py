"""What the in-process fast-round tests give a round as its engine (``fast_rounds.Parking``)."""
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
