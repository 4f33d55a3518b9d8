"""A training function shape the bindings' elastic tests share (tests/parallel/test_*_elastic.py)."""
from typing import Any, Callable, List, Tuple

from horovod.common.exceptions import HorovodInternalError


def run_failing_once(run: Callable, state: Any, finish: Callable[[int], Any]) -> Tuple[Any, List[int]]:
    """Run, under the binding's ``hvd.elastic.run``, a function that commits one more step per attempt, changes
    the step without committing and fails its first attempt with HorovodInternalError, then returns
    ``finish(step)``. Returns (the result, the step each attempt started from)."""
    attempts: List[int] = []

    @run
    def train(state):
        attempts.append(state.step)
        state.step += 1
        state.commit()
        if len(attempts) == 1:
            state.step = 100                     # uncommitted: the restore undoes it
            raise HorovodInternalError("simulated: a rank was lost")
        return finish(state.step)

    return train(state), attempts
