"""TF1 graph mode: hvd.DistributedOptimizer around tf.compat.v1.train optimizers, backward_passes_per_step,
broadcast_global_variables and BroadcastGlobalVariablesHook, each in its own tf.Graph + tf.compat.v1.Session
(eager execution stays on for the rest of the process).

Rank r's gradient is c_r = r + 1 (times a per-step factor), so the expected reduced values are computed from the
ranks' known contributions: mean = (size + 1) / 2, sum = size * (size + 1) / 2.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

v1 = tf.compat.v1
CONFIG = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)


def contributions():
    return np.arange(1, hvd.size() + 1, dtype=np.float64)


def session():
    return v1.Session(config=CONFIG)


@pytest.mark.parametrize("op_name", ["Average", "Sum"])
@pytest.mark.parametrize("groups", [None, 2])
def test_compute_gradients_are_reduced_and_applied(op_name, groups):
    c, rank = contributions(), hvd.rank()
    reduced = c.mean() if op_name == "Average" else c.sum()
    with tf.Graph().as_default():
        a = v1.get_variable("a", initializer=tf.constant([1.0, 2.0], tf.float64))
        b = v1.get_variable("b", initializer=tf.constant([[3.0]], tf.float64))
        unused = v1.get_variable("unused", initializer=tf.constant(5.0, tf.float64))
        scale = v1.placeholder(tf.float64, [])
        loss = scale * (tf.reduce_sum(a) + 2.0 * tf.reduce_sum(b))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.5), op=getattr(hvd, op_name),
                                       groups=groups)
        assert isinstance(opt, v1.train.Optimizer)
        assert opt.get_name() == "DistributedGradientDescentOptimizer"
        grads_and_vars = opt.compute_gradients(loss, var_list=[a, b, unused])
        assert grads_and_vars[2][0] is None and grads_and_vars[2][1] is unused
        train_op = opt.apply_gradients([(g, v) for g, v in grads_and_vars if g is not None])
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            ga, gb = sess.run([grads_and_vars[0][0], grads_and_vars[1][0]], {scale: c[rank]})
            np.testing.assert_allclose(ga, [reduced, reduced])
            np.testing.assert_allclose(gb, [[2.0 * reduced]])
            sess.run(train_op, {scale: c[rank]})
            np.testing.assert_allclose(sess.run(a), [1.0 - 0.5 * reduced, 2.0 - 0.5 * reduced])
            np.testing.assert_allclose(sess.run(b), [[3.0 - 0.5 * 2.0 * reduced]])


def test_minimize_with_a_slot_optimizer_keeps_ranks_in_sync():
    c, rank = contributions(), hvd.rank()
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([0.5, -0.5], tf.float64))
        step = v1.train.get_or_create_global_step()
        loss = tf.reduce_sum((w - c[rank]) ** 2)
        opt = hvd.DistributedOptimizer(v1.train.AdagradOptimizer(0.1), compression=hvd.Compression.fp16)
        train_op = opt.minimize(loss, global_step=step)
        assert opt.get_slot_names() == ["accumulator"]
        assert opt.get_slot(w, "accumulator") is not None
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train_op)
            values = sess.run(w)
            assert sess.run(step) == 3
    gathered = hvd.allgather(tf.constant(values[None, :])).numpy()
    np.testing.assert_allclose(gathered, np.repeat(values[None, :], hvd.size(), axis=0))


def test_sparse_gradients_are_gathered():
    size, rank = hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        table = v1.get_variable("table", initializer=tf.ones([size + 1, 2], tf.float64))
        loss = tf.reduce_sum(tf.gather(table, [rank])) * float(rank + 1)
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0))
        ((grad, _),) = opt.compute_gradients(loss, var_list=[table])
        assert isinstance(grad, tf.IndexedSlices)
        train_op = opt.apply_gradients([(grad, table)])
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op)
            result = sess.run(table)
    expected = np.ones((size + 1, 2))
    for r in range(size):
        expected[r] -= (r + 1) / size
    np.testing.assert_allclose(result, expected)


@pytest.mark.parametrize("average", [False, True], ids=["summed", "averaged"])
def test_backward_passes_per_step_applies_every_second_step(average):
    c, rank = contributions(), hvd.rank()
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([10.0, 20.0], tf.float64))
        step = v1.train.get_or_create_global_step()
        factor = v1.placeholder(tf.float64, [])
        loss = factor * c[rank] * tf.reduce_sum(w)
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2,
                                       average_aggregated_gradients=average)
        train_op = opt.minimize(loss, global_step=step)
        assert {v.op.name for v in v1.local_variables()} >= {
            "aggregation_variables/aggregation_counter"}, "the accumulators are local, not broadcast"
        with session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            expected = np.array([10.0, 20.0])
            factors = [1.0, 2.0, 3.0, 5.0]
            for k, f in enumerate(factors):
                sess.run(train_op, {factor: f})
                if k % 2 == 1:
                    # the two steps' local gradients, summed, then averaged over ranks
                    expected = expected - (factors[k - 1] + f) * c.mean() / (2 if average else 1)
                np.testing.assert_allclose(sess.run(w), expected, err_msg=f"after step {k + 1}")
                assert sess.run(step) == k + 1, "the global step counts every backward pass"


def test_local_variables_keep_their_own_scaled_gradient():
    c, size, rank = contributions(), hvd.size(), hvd.rank()
    with tf.Graph().as_default():
        shared = v1.get_variable("shared", initializer=tf.constant(1.0, tf.float64))
        mine = v1.get_variable("mine", initializer=tf.constant(1.0, tf.float64))
        loss = c[rank] * (shared + 3.0 * mine)
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(mine)
        (g_shared, _), (g_mine, _) = opt.compute_gradients(loss, var_list=[shared, mine])
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            got_shared, got_mine = sess.run([g_shared, g_mine])
    np.testing.assert_allclose(got_shared, c.mean())
    np.testing.assert_allclose(got_mine, 3.0 * c[rank] / size)


def test_legacy_optimizer_eagerly_with_a_callable_loss():
    c, rank = contributions(), hvd.rank()
    w = tf.Variable([1.0, 1.0], dtype=tf.float64)
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0))
    opt.minimize(lambda: c[rank] * tf.reduce_sum(w), var_list=[w])
    np.testing.assert_allclose(w.numpy(), 1.0 - c.mean())


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_aggregation_helper_eagerly_and_in_tf_function(mode):
    """backward_passes_per_step=2 outside TF1 graphs: step k's gradient is (k + 1) * c_r; averaged pairs."""
    c, rank = contributions(), hvd.rank()
    w = tf.Variable([1.0, 1.0], dtype=tf.float64)
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)

    def step(k):
        grads_and_vars = opt.compute_gradients(lambda: k * c[rank] * tf.reduce_sum(w), var_list=[w])
        return opt.apply_gradients(grads_and_vars)

    if mode == "function":
        step = tf.function(step)
    history = []
    for k in range(1, 5):
        step(tf.constant(float(k), tf.float64))
        history.append(w.numpy()[0])
    mean = c.mean()
    expected = [1.0, 1.0 - 1.5 * mean, 1.0 - 1.5 * mean, 1.0 - 5.0 * mean]
    np.testing.assert_allclose(history, expected)


def broadcast_graph(root):
    """Variables whose initial values differ per rank, plus an int64 global step."""
    rank = hvd.rank()
    a = v1.get_variable("a", initializer=tf.constant([[float(rank)] * 3] * 2, tf.float32))
    b = v1.get_variable("b", initializer=tf.constant(rank * 7, tf.int32))
    step = v1.train.get_or_create_global_step()
    init_step = step.assign(rank + 100)
    expected = ([[float(root)] * 3] * 2, root * 7, root + 100)
    return (a, b, step), init_step, expected


def test_broadcast_global_variables_sets_every_rank_to_roots_values():
    root = hvd.size() - 1
    with tf.Graph().as_default():
        variables, init_step, expected = broadcast_graph(root)
        # a gradient allreduce that needs a feed, built before the broadcast: running the broadcast must
        # neither need that feed nor run that allreduce
        x = v1.placeholder(tf.float32, [2, 3])
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0))
        opt.minimize(tf.reduce_sum(x * variables[0]))
        bcast = hvd.broadcast_global_variables(root)
        assert isinstance(bcast, tf.Operation)
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(init_step)
            sess.run(bcast)
            got = sess.run(list(variables))
    np.testing.assert_allclose(got[0], expected[0])
    assert got[1] == expected[1] and got[2] == expected[2]


def test_broadcast_hook_in_monitored_training_session():
    root = 0
    with tf.Graph().as_default():
        (a, b, step), _, expected = broadcast_graph(root)
        w = v1.get_variable("w", initializer=tf.constant([float(hvd.rank())], tf.float64))
        c = contributions()
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.5))
        train_op = opt.minimize(c[hvd.rank()] * tf.reduce_sum(w), global_step=step)
        with tf.control_dependencies([train_op]):
            w_after = w.read_value()
        hooks = [hvd.BroadcastGlobalVariablesHook(root), v1.train.StopAtStepHook(last_step=3)]
        with v1.train.MonitoredTrainingSession(hooks=hooks, config=CONFIG, log_step_count_steps=None,
                                               save_summaries_steps=None, save_checkpoint_secs=None) as sess:
            got = sess.run([a, b])
            runs = 0
            while not sess.should_stop():
                final_w = sess.run(w_after)
                runs += 1
    np.testing.assert_allclose(got[0], expected[0])
    assert got[1] == expected[1]
    # the global step starts at 0 on every rank (rank 0's), so StopAtStepHook stops after 3 steps everywhere
    assert runs == 3
    np.testing.assert_allclose(final_w, [float(root) - 3 * 0.5 * c.mean()])


def test_hook_rebuilds_its_op_for_a_new_graph():
    hook = hvd.BroadcastGlobalVariablesHook(0)
    ops = []
    for _ in range(2):
        with tf.Graph().as_default() as graph:
            v1.get_variable("v", initializer=tf.constant(float(hvd.rank())))
            hook.begin()
            assert hook.bcast_op.graph is graph
            ops.append(hook.bcast_op)
    assert ops[0] is not ops[1]


def test_broadcast_global_variables_refuses_eager_mode():
    with pytest.raises(RuntimeError) as info:
        hvd.broadcast_global_variables(0)
    assert str(info.value) == ("hvd.broadcast_global_variables() does not support eager execution. "
                               "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")


def test_unsupported_optimizers_and_arguments_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="doesn't inherit from either legacy TensorFlow or Keras optimizer"):
        hvd.DistributedOptimizer(object())
    # Adasum is available (test_tensorflow_adasum.py), but not with upstream's refused combinations.
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients == True"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum,
                                 average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be a positive integer"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=0)


def test_keras_optimizer_is_delegated_to_horovod_tensorflow_keras():
    hvd_keras = pytest.importorskip("horovod.tensorflow.keras")
    keras = pytest.importorskip("keras")
    c, rank = contributions(), hvd.rank()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), backward_passes_per_step=1)
    assert isinstance(opt, keras.optimizers.SGD)
    assert type(opt).__module__ != keras.optimizers.SGD.__module__ or type(opt) is not keras.optimizers.SGD
    assert hvd_keras.DistributedOptimizer is not hvd.DistributedOptimizer
    w = keras.Variable(np.array([1.0, 1.0], np.float32))
    opt.apply_gradients([(tf.constant([c[rank], c[rank]], tf.float32), w)])
    np.testing.assert_allclose(np.asarray(w.numpy()), 1.0 - c.mean(), rtol=1e-6)


def test_upstream_util_helpers():
    from horovod.tensorflow.util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs

    assert hvd._executing_eagerly is _executing_eagerly and _executing_eagerly()
    with tf.Graph().as_default():
        assert not hvd._executing_eagerly()
    assert not tf.function(lambda: tf.constant(_executing_eagerly()))().numpy()
    calls = []
    cached = _cache(lambda x: calls.append(x) or x * 2)
    assert cached(3) == 6 and cached(3) == 6 and calls == [3]
    assert _make_subgraph(lambda x: x + 1)(tf.constant(1)).numpy() == 2
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    refs = vars_to_refs([a, [b]])
    assert hash(refs) is not None and refs_to_vars(refs)[0] is a and refs_to_vars(refs)[1][0] is b


def test_broadcast_inplace_in_a_graph_returns_the_new_values():
    size, rank = hvd.size(), hvd.rank()
    root = size - 1
    with tf.Graph().as_default():
        a = v1.get_variable("a", initializer=tf.fill([3], float(rank)))
        b = v1.get_variable("b", initializer=tf.fill([2], rank))
        new_values = hvd.broadcast_([a, b], root)
        assert all(isinstance(t, tf.Tensor) for t in new_values)
        bcast = hvd.broadcast_variables([a, b], root_rank=0)
        assert isinstance(bcast, tf.Operation)
        with session() as sess:
            sess.run(v1.global_variables_initializer())
            got_a, got_b = sess.run(new_values)
            np.testing.assert_allclose(got_a, np.full(3, float(root)))
            np.testing.assert_array_equal(got_b, np.full(2, root))
            np.testing.assert_allclose(sess.run(a), np.full(3, float(root)))
            sess.run(v1.global_variables_initializer())
            assert sess.run(bcast) is None
            np.testing.assert_allclose(sess.run(a), np.zeros(3))
    c = tf.Variable(tf.fill([2], float(rank)))
    assert hvd.broadcast_variables([c], root_rank=root) is None   # eagerly: assigned at once, as upstream
    np.testing.assert_allclose(c.numpy(), np.full(2, float(root)))


def test_broadcast_object_and_object_fn_in_a_graph_and_eagerly():
    root = hvd.size() - 1
    obj = {"rank": hvd.rank(), "list": [1, 2]}
    with tf.Graph().as_default():
        with session() as sess:
            assert hvd.broadcast_object(obj, root_rank=root, session=sess) == {"rank": root, "list": [1, 2]}
            fn = hvd.broadcast_object_fn(root_rank=root, session=sess, name="graph.fn")
            assert fn(("from", hvd.rank())) == ("from", root)
    fn = hvd.broadcast_object_fn(root_rank=root, name="eager.fn")
    assert fn(("from", hvd.rank())) == ("from", root)
    assert hvd.allgather_object(hvd.rank(), name="graph.objects") == list(range(hvd.size()))
