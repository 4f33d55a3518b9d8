"""An elastic Keras 3 job on TensorFlow through ``horovod.keras``, for tests/integration/test_elastic_tf2.py: a
linear model trained with ``model.fit`` (its train function is a ``tf.function``, traced once) and the elastic
callbacks, a commit every batch.

Knobs: ``EPOCHS`` (4); ``GROW_AT`` + ``HOSTS_FILE`` + ``EXTRA_HOST``: at the first batch of epoch ``GROW_AT``, a job of
one worker appends the line ``EXTRA_HOST`` to the discovery's hosts file and waits for the driver's notice;
``KILL_HOST`` + ``KILL_AT`` + ``MARKER``: the worker whose ``HOROVOD_HOSTNAME`` is ``KILL_HOST`` SIGKILLs itself after
batch 2 of epoch ``KILL_AT``, once per marker file.

Printed lines (rank-prefixed by horovodrun): ``START size=<n> epoch=<e> hash=<h>`` each time the training function
(re)starts, after the state was synced, and ``DONE size=<n> epoch=<e> hash=<h>`` at the end.
"""
import hashlib
import os
import signal
import time

import keras
import numpy as np

import horovod.keras as hvd

EPOCHS = int(os.environ.get("EPOCHS", "4"))

hvd.init()
keras.utils.set_random_seed(0)
x = np.random.rand(256, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def model_hash() -> str:
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]


class Interventions(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if hvd.size() == 1 and state.epoch == int(os.environ.get("GROW_AT", "-1")) and batch == 0:
            with open(os.environ["HOSTS_FILE"], "a") as hosts:
                hosts.write(os.environ["EXTRA_HOST"] + "\n")
            while state._host_messages.empty():     # the next commit re-forms the job
                time.sleep(0.05)
        marker = os.environ.get("MARKER", "")
        if state.epoch == int(os.environ.get("KILL_AT", "-1")) and batch == 2 and not os.path.exists(marker) \
                and os.environ.get("HOROVOD_HOSTNAME") == os.environ.get("KILL_HOST"):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


@hvd.elastic.run
def train(state):
    print(f"START size={hvd.size()} epoch={state.epoch} hash={model_hash()}", flush=True)
    # as upstream's examples: the epochs left (UpdateEpochStateCallback counts from 0 in each fit)
    model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], batch_size=16, epochs=EPOCHS - state.epoch,
              verbose=0, callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                                    hvd.elastic.UpdateBatchStateCallback(state),
                                    hvd.elastic.CommitStateCallback(state, batches_per_commit=1), Interventions()])


train(state)
print(f"DONE size={hvd.size()} epoch={state.epoch} hash={model_hash()}", flush=True)
