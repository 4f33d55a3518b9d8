"""The ``HorovodCollective`` kernel keeps the Python thread state of the TensorFlow thread it runs on
(horovod/tensorflow/kernel.py::_keep_thread_state): a ctypes callback would otherwise make a new one, with empty
thread-locals, on every call."""
import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from horovod.tensorflow import kernel  # noqa: E402

pytestmark = pytest.mark.skipif(not kernel.available(), reason="the HorovodCollective op could not be registered")

CALLS = 20


def test_a_thread_running_the_kernel_sees_its_thread_locals_again():
    local = threading.local()
    fresh, threads = [], set()

    def body(outputs, x):
        threads.add(threading.get_ident())
        if not getattr(local, "seen", False):
            fresh.append(threading.get_ident())
            local.seen = True
        return [np.asarray(x) * 2]

    @tf.function
    def doubled(x):
        return kernel.collective_op(body, [x], [x.dtype], "thread_state")[0]

    for _ in range(CALLS):
        np.testing.assert_array_equal(doubled(tf.ones([3])).numpy(), np.full(3, 2.0, np.float32))
    if threads == {threading.main_thread().ident}:
        pytest.skip("TensorFlow ran the kernel on the calling thread, which has a thread state of its own")
    assert len(fresh) == len(threads) < CALLS, f"{len(fresh)} fresh thread states in {CALLS} calls"
