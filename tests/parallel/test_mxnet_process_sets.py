"""horovod.mxnet collectives and DistributedTrainer on process sets: the even and the odd ranks as two sets (of
unequal sizes at 3 ranks), each op run on the set this rank is in and compared with the value computed from every
member's input. At 1 rank there is only the global set: the tests skip.
"""
import mxnet as mx
import numpy as np
import pytest

import horovod.mxnet as hvd
from tests.support.process_sets import even_odd_sets  # (turns dynamic process sets on)


@pytest.fixture
def sets():
    """(this rank's set, the other set): the even and the odd ranks; removed afterwards."""
    yield from even_odd_sets()


def values(rank, shape, dtype="float64"):
    return (np.arange(int(np.prod(shape))).reshape(shape) + 10 * rank).astype(dtype)


def test_collectives_on_a_set(sets):
    mine, _ = sets
    rank, members = hvd.rank(), mine.ranks
    out = hvd.allreduce(mx.nd.array(values(rank, (3,)), dtype="float64"), name="ps.avg", process_set=mine)
    np.testing.assert_allclose(out.asnumpy(), sum(values(r, (3,)) for r in members) / len(members))
    tensor = mx.nd.array(values(rank, (2, 2)), dtype="int32")
    hvd.allreduce_(tensor, op=hvd.Sum, name="ps.sum_", process_set=mine)
    np.testing.assert_array_equal(tensor.asnumpy(), sum(values(r, (2, 2), "int32") for r in members))
    outs = hvd.grouped_allreduce([mx.nd.array(values(rank, (2,)))], op=hvd.Max, name="ps.group", process_set=mine)
    np.testing.assert_array_equal(outs[0].asnumpy(), values(max(members), (2,)))
    gathered = hvd.allgather(mx.nd.array(values(rank, (1, 2))), name="ps.ag", process_set=mine)
    np.testing.assert_array_equal(gathered.asnumpy(), np.concatenate([values(r, (1, 2)) for r in members]))
    root = members[-1]                                     # a global rank
    target = mx.nd.array(values(rank, (4,)), dtype="int64")
    hvd.broadcast_(target, root, name="ps.bc", process_set=mine)
    np.testing.assert_array_equal(target.asnumpy(), values(root, (4,), "int64"))
    pos = members.index(rank)
    scattered = hvd.reducescatter(mx.nd.array(values(rank, (len(members), 2))), op=hvd.Sum, name="ps.rs",
                                  process_set=mine)
    np.testing.assert_array_equal(scattered.asnumpy(),
                                  sum(values(r, (len(members), 2)) for r in members)[pos:pos + 1])
    swapped = hvd.alltoall(mx.nd.array(values(rank, (len(members), 2))), name="ps.a2a", process_set=mine)
    np.testing.assert_array_equal(swapped.asnumpy(),
                                  np.stack([values(r, (len(members), 2))[pos] for r in members]))


def test_distributed_trainer_averages_over_its_set(sets):
    mine, _ = sets
    rank, members = hvd.rank(), mine.ranks
    net = mx.gluon.nn.Dense(2, in_units=3, prefix="psnet_")
    net.initialize()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, process_set=mine)
    assert trainer._scale == pytest.approx(1.0 / len(members)), "the average divides by the set's size"
    for _, param in sorted(net.collect_params().items()):
        param.grad()[:] = rank + 1
    trainer.allreduce_grads()
    for _, param in sorted(net.collect_params().items()):
        np.testing.assert_array_equal(param.grad().asnumpy(), np.full(param.shape, sum(r + 1 for r in members)))
