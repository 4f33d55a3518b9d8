"""An elastic TensorFlow 2 training program shaped as upstream Horovod's ``test/integration/data/
elastic_tensorflow2_main.py``, for tests/integration/test_elastic_tf2.py.

A tf.keras model (``tf.keras`` is tf-keras under ``TF_USE_LEGACY_KERAS=1``, else Keras 3) trained with
``hvd.DistributedGradientTape`` on a fixed random batch, ``hvd.elastic.TensorFlowKerasState(model, optimizer,
batch=0, epoch=0, commits=0, rendezvous=0)``, a training function decorated with ``hvd.elastic.run``,
``state.commit()`` every ``--batches-per-commit`` batches and a reset callback that rescales the learning rate to
the new size.

Options (upstream's): ``--logfile`` (rank 0 appends one JSON line per epoch: epoch, batch, commits, hostname,
start_rank, rank, size, rendezvous; the discovery script of :func:`tests.support.elastic.schedule_discovery_script`
counts these lines to know the epoch), ``--discovery-schedule`` (JSON ``[[epoch or null, [host:slots, ...]], ...]``:
at the end of an epoch after which the hosts change, rank 0 waits up to ``--discovery-wait`` s for the driver's
notice and fails with TimeoutError without one), ``--exit-schedule`` (JSON ``{"(epoch, batch)": [start ranks]}``)
with ``--exit-mode exception|kill`` (the workers started with those ranks raise RuntimeError, or SIGKILL
themselves, at that batch), ``--epochs``, ``--batches-per-epoch``, ``--epoch-wait``. One of ours:
``--wait-for-size`` (JSON ``{"<epoch>": size}``): at the end of that epoch, rank 0 also waits for a notice when the
job runs at fewer workers (a host whose blacklist cooldown ends comes back while the discovery's answer stays the
same).

Printed lines (rank-prefixed by horovodrun): ``START rendezvous=<n> size=<n> rank=<r> epoch=<e> batch=<b>
hash=<h>`` each time the training function (re)starts, after the state was synced (ranks of one round print the
same hash), and ``DONE size=<n> rank=<r> hash=<h>`` at the end.
"""
import argparse
import hashlib
import json
import os
import signal
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow 2 Elastic Test")
parser.add_argument("--batches-per-epoch", type=int, default=10)
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--epoch-wait", type=float, default=0)
parser.add_argument("--logfile", default="/tmp/logfile.txt")
parser.add_argument("--discovery-schedule", default="[]")
parser.add_argument("--discovery-wait", type=float, default=3)
parser.add_argument("--exit-schedule", default=None)
parser.add_argument("--exit-mode", default="exception", choices=["exception", "kill"])
parser.add_argument("--wait-for-size", default="{}")
args = parser.parse_args()

hvd.init()

tf.keras.utils.set_random_seed(1)       # Python, NumPy, TensorFlow and Keras 3 (the layer initializers)
batch_size = 32
data = tf.random.uniform([batch_size, 2], seed=2)
indices = tf.random.uniform([batch_size], minval=0, maxval=2, dtype=tf.int64, seed=3)
target = tf.one_hot(indices, 2)

lr = 0.001
model = tf.keras.Sequential([tf.keras.layers.Dense(2, activation="softmax")])
optimizer = tf.keras.optimizers.SGD(lr * hvd.size(), momentum=0.9)

hostname = os.environ.get("HOROVOD_HOSTNAME")
start_rank = int(os.environ.get("HOROVOD_RANK", 0))

discovery_schedule = json.loads(args.discovery_schedule)
epoch_to_hosts = {epoch: hosts for epoch, hosts in discovery_schedule if epoch is not None}
default_hosts = discovery_schedule[-1][1] if discovery_schedule else []
exit_schedule = json.loads(args.exit_schedule) if args.exit_schedule else {}
wait_for_size = json.loads(args.wait_for_size)


def model_hash() -> str:
    digest = hashlib.sha256()
    for variable in model.variables:
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()[:16]


def check_exit(epoch: int, batch: int) -> None:
    if start_rank in exit_schedule.get(str((epoch, batch)), []):
        if args.exit_mode == "exception":
            raise RuntimeError(f"check_rank and exit epoch={epoch} batch={batch} start_rank={start_rank} "
                               f"rank={hvd.rank()}")
        os.kill(os.getpid(), signal.SIGKILL)


def log_state(state) -> None:
    state_dict = {"epoch": state.epoch, "batch": state.batch, "commits": state.commits, "hostname": hostname,
                  "start_rank": start_rank, "rank": hvd.rank(), "size": hvd.size(), "rendezvous": state.rendezvous}
    with open(args.logfile, "a") as f:
        f.write(json.dumps(state_dict) + os.linesep)


def training_step(allreduce: bool = True) -> None:
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.reduce_mean(tf.keras.losses.categorical_crossentropy(target, probs))
    if allreduce:
        tape = hvd.DistributedGradientTape(tape)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))


train_one_batch = tf.function(training_step)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    print(f"START rendezvous={state.rendezvous} size={hvd.size()} rank={hvd.rank()} epoch={state.epoch} "
          f"batch={state.batch} hash={model_hash()}", flush=True)
    while state.epoch < args.epochs:
        while state.batch < args.batches_per_epoch:
            check_exit(state.epoch, state.batch)
            train_one_batch()
            state.batch += 1
            if state.batch % args.batches_per_commit == 0:
                state.commits += 1
                state.commit()

        if hvd.rank() == 0:
            log_state(state)
            current_hosts = epoch_to_hosts.get(state.epoch, default_hosts)
            next_hosts = epoch_to_hosts.get(state.epoch + 1, default_hosts)
            regrow = hvd.size() < wait_for_size.get(str(state.epoch), 0)
            if args.discovery_wait > 0 and (current_hosts != next_hosts or regrow):
                print(f"host changes: {current_hosts} -> {next_hosts}" if not regrow else
                      f"waiting for the job to grow back to {wait_for_size[str(state.epoch)]}", flush=True)
                start = time.time()
                while state._host_messages.empty():
                    if time.time() - start > args.discovery_wait:
                        raise TimeoutError("Timed out waiting for notifications from driver.")
                    time.sleep(0.1)

        if args.epoch_wait > 0:
            time.sleep(args.epoch_wait)

        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


def on_state_reset():
    optimizer.learning_rate.assign(lr * hvd.size())


# Horovod: initialize model and optimizer state so we can synchronize across workers (upstream's examples take a
# local step, without a collective: a worker that joins a running job is synced by hvd.elastic.run).
training_step(allreduce=False)

state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
state.register_reset_callbacks([on_state_reset])
train(state)
print(f"DONE size={hvd.size()} rank={hvd.rank()} hash={model_hash()}", flush=True)
