"""Worker: programs that make every rank wait, or keep some rank waiting, without a deadlock.

Run with a short deadlock window (the test sets HOROVOD_DEADLOCK_CHECK_TIME_SECONDS): each scenario holds one of
the states the detector must not report for longer than that window (``LATE`` seconds), or passes through the
cross-waiting state a multi-threaded program passes through, but shorter than the window. Each scenario prints
``PASSED <name>``; the job must end normally with nothing reported.
"""
import sys
import threading
import time

import numpy as np

import horovod.numpy as hvd
from horovod.core import ops

LATE = float(sys.argv[1])       # longer than the deadlock window
TRANSIENT = float(sys.argv[2])  # shorter than it


def late_rank_with_the_response_cache() -> None:
    """The last rank reaches each step late; the others wait (the tensor is in the response cache after step 0)."""
    last = hvd.size() - 1
    for step in range(3):
        if hvd.rank() == last and step > 0:
            time.sleep(LATE)
        out = hvd.allreduce(np.full(4, float(step)), name="free.cached", op=hvd.Sum)
        assert out[0] == step * hvd.size(), out


def late_rank_in_a_group() -> None:
    """A grouped allreduce that one rank submits late: the others wait on every member."""
    if hvd.rank() == 1:
        time.sleep(LATE)
    outs = hvd.grouped_allreduce([np.ones(3), np.ones(5)], name="free.group", op=hvd.Sum)
    assert [o[0] for o in outs] == [hvd.size()] * 2, outs


def joined_rank() -> None:
    """Rank 0 joins at once and waits there; the others run allreduces, one of them late each time."""
    if hvd.rank() == 0:
        hvd.join()
        return
    for step in range(2):
        if hvd.rank() == hvd.size() - 1:
            time.sleep(LATE)
        hvd.allreduce(np.ones(2), name=f"free.joined.{step}", op=hvd.Sum)
    hvd.join()


def two_threads_in_opposite_orders() -> None:
    """Two threads per rank submit ``a`` and ``b`` and poll their handles with short timed waits (as TF1-graph
    ops do); odd ranks submit them in the other order, so for ``TRANSIENT`` seconds the ranks wait on different
    tensors."""
    first, second = ("a", "b") if hvd.rank() % 2 == 0 else ("b", "a")
    errors = []

    def run(name: str, delay: float) -> None:
        try:
            time.sleep(delay)
            handle = ops.allreduce_async(np.ones(3), name=f"free.threads.{name}")
            while True:
                try:
                    handle.wait(timeout=0.005)
                    return
                except TimeoutError:
                    continue
        except Exception as exc:
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(first, 0.0)), threading.Thread(target=run, args=(second, TRANSIENT))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


def torch_distributed_optimizer() -> None:
    """horovod.torch's DistributedOptimizer: hooks submit during backward, step() waits; rank 1's backward is
    slow (a hook sleeps), so the other ranks wait in step() meanwhile."""
    import torch

    import horovod.torch as hvd_torch

    hvd_torch.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    if hvd_torch.rank() == 1:
        model[0].weight.register_hook(lambda grad: time.sleep(LATE) or grad)
    optimizer = hvd_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
    hvd_torch.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(2):
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()


SCENARIOS = [late_rank_with_the_response_cache, late_rank_in_a_group, joined_rank, two_threads_in_opposite_orders,
             torch_distributed_optimizer]


def main() -> None:
    hvd.init()
    for scenario in SCENARIOS:
        scenario()
        hvd.barrier()
        print("PASSED", scenario.__name__, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
