"""horovod.mxnet training helpers at any number of ranks: DistributedTrainer and DistributedOptimizer against
single-process training on the concatenated batch, and broadcast_parameters (ParameterDicts, deferred
initialisation, plain dicts of NDArrays).
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import horovod.mxnet as hvd

BATCH = 6            # rows per rank
STEPS = 4
SGD = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def make_net(tag, seed, in_units=True):
    net = gluon.nn.HybridSequential(prefix=f"{tag}_")
    with net.name_scope():
        net.add(gluon.nn.Dense(16, activation="tanh", in_units=8 if in_units else 0),
                gluon.nn.Dense(3, in_units=16 if in_units else 0))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


def global_batch(size):
    rng = np.random.RandomState(7)
    x = rng.randn(size * BATCH, 8).astype(np.float32)
    y = rng.randint(0, 3, size * BATCH).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(y)


def train(net, trainer, x, y, batch_size):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(STEPS):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch_size)
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]


def reference(tag, op=hvd.Average):
    """Single-process training on every rank's rows together (Sum: the gradient summed, not averaged, over ranks)."""
    size = hvd.size()
    x, y = global_batch(size)
    net = make_net(tag, seed=1)
    trainer = gluon.Trainer(net.collect_params(), "sgd", dict(SGD), kvstore=None)
    return train(net, trainer, x, y, BATCH * size if op == hvd.Average else BATCH)


def distributed(tag, make_trainer):
    """This rank's part of the job: a differently initialised net, broadcast from rank 0, trained on its rows."""
    size, rank = hvd.size(), hvd.rank()
    x, y = global_batch(size)
    net = make_net(tag, seed=1 + rank)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    return train(net, make_trainer(net.collect_params()), x[rows], y[rows], BATCH)


def assert_same_params(got, want, tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


TRAINER_CASES = {
    "defaults": ({}, 1e-5),
    "predivide": ({"gradient_predivide_factor": 2.0}, 1e-5),
    "num_groups": ({"num_groups": 2}, 1e-5),
    "fp16": ({"compression": hvd.Compression.fp16}, 2e-3),
    "sum": ({"op": hvd.Sum}, 1e-5),
}


@pytest.mark.parametrize("case", sorted(TRAINER_CASES))
def test_distributed_trainer_matches_single_process_training(case):
    knobs, tol = TRAINER_CASES[case]
    want = reference(f"ref_{case}", knobs.get("op", hvd.Average))
    got = distributed(f"dt_{case}", lambda params: hvd.DistributedTrainer(params, "sgd", dict(SGD),
                                                                         prefix=f"{case}.", **knobs))
    assert_same_params(got, want, tol)


@pytest.mark.parametrize("num_groups", [0, 2])
def test_distributed_optimizer_matches_single_process_training(num_groups):
    want = reference(f"ref_opt{num_groups}")

    def make(params):
        opt = hvd.DistributedOptimizer(mx.optimizer.SGD(**SGD), num_groups=num_groups)
        return gluon.Trainer(params, opt, kvstore=None)

    got = distributed(f"do{num_groups}", make)
    assert_same_params(got, want, 1e-5)


def test_distributed_trainer_unwraps_a_distributed_optimizer():
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(**SGD))
    with pytest.warns(UserWarning, match="unwrapped it for you"):
        trainer = hvd.DistributedTrainer(make_net("unwrap", 0).collect_params(), opt)
    assert trainer._optimizer is opt._optimizer


def gathered_rows(params):
    """Every rank's values of ``params`` (a list of NDArrays), one row per rank."""
    flat = mx.nd.concat(*[p.reshape((-1,)) for p in params], dim=0)
    return hvd.allgather(flat.reshape((1, -1)), name="gathered_rows").asnumpy()


def assert_everyone_has_roots(params, root):
    rows = gathered_rows(params)
    for r in range(hvd.size()):
        np.testing.assert_array_equal(rows[r], rows[root])


def test_broadcast_parameters_of_initialised_and_deferred_gluon_parameters():
    size, rank = hvd.size(), hvd.rank()
    root = size - 1
    net = make_net("bp", seed=10 + rank)
    hvd.broadcast_parameters(net.collect_params(), root_rank=root)
    assert_everyone_has_roots([p.data() for _, p in sorted(net.collect_params().items())], root)

    deferred = make_net("bpd", seed=20 + rank, in_units=False)         # shapes known at the first forward only
    hvd.broadcast_parameters(deferred.collect_params(), root_rank=root, prefix="deferred.")
    deferred(mx.nd.ones((2, 5)))
    values = [p.data() for _, p in sorted(deferred.collect_params().items())]
    assert values[1].shape == (16, 5)                  # bpd_dense0_weight, after its bias
    assert_everyone_has_roots(values, root)
    if size > 1:        # the ranks' own initial values really differed
        own = make_net("bpd_own", seed=20 + rank, in_units=False)
        own(mx.nd.ones((2, 5)))
        mine = [p.data() for _, p in sorted(own.collect_params().items())]
        assert not np.array_equal(gathered_rows(mine)[0], gathered_rows(mine)[root])


def test_broadcast_parameters_of_plain_dicts():
    size, rank = hvd.size(), hvd.rank()
    root = size - 1
    arrays = {"b": mx.nd.full((2, 3), rank, dtype="float64"), "a": mx.nd.full((4,), rank + 10, dtype="int32")}
    hvd.broadcast_parameters(arrays, root_rank=root)
    np.testing.assert_array_equal(arrays["b"].asnumpy(), np.full((2, 3), root))
    np.testing.assert_array_equal(arrays["a"].asnumpy(), np.full((4,), root + 10))
    net = make_net("bpdict", seed=30 + rank)
    hvd.broadcast_parameters(dict(net.collect_params().items()), root_rank=0)
    assert_everyone_has_roots([p.data() for _, p in sorted(net.collect_params().items())], 0)


def module_fit(x, y, optimizer, epochs=3):
    """Upstream's mxnet_mnist.py shape: a symbolic Module fitted without a kvstore, from rank 0's parameters."""
    data = mx.sym.var("data")
    hidden = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=16, name="fc1"), act_type="tanh")
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax")
    batches = mx.io.NDArrayIter(x, y, batch_size=x.shape[0])
    module = mx.mod.Module(out, context=mx.cpu())
    module.bind(data_shapes=batches.provide_data, label_shapes=batches.provide_label)
    mx.random.seed(3 + hvd.rank())
    module.init_params(mx.init.Xavier())
    arg_params, aux_params = module.get_params()
    hvd.broadcast_parameters(arg_params, root_rank=0)
    module.set_params(arg_params, aux_params)
    module.fit(batches, num_epoch=epochs, kvstore=None, optimizer=optimizer)
    return [v.asnumpy() for _, v in sorted(module.get_params()[0].items())]


def test_distributed_optimizer_in_a_module_matches_single_process_training():
    size, rank = hvd.size(), hvd.rank()
    x, y = (a.asnumpy() for a in global_batch(size))
    want = module_fit(x, y, mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=1.0 / (size * BATCH)))
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=1.0 / BATCH))
    got = module_fit(x[rows], y[rows], opt)
    assert_same_params(got, want, 1e-5)
