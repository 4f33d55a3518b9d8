"""An elastic PyTorch training job for tests/integration/test_elastic*.py, steered by environment variables.

A linear model on a fixed synthetic data set of ``SAMPLES`` rows, ``hvd.elastic.run`` with a ``TorchState`` that
tracks the model, the optimizer, an ``ElasticSampler`` and the sample indices processed so far in each epoch
(allgathered every batch, so that every rank holds the whole job's record, committed and restored with the rest).

Printed lines the tests read (one per event, rank-prefixed by horovodrun):

- ``START size=<n> epoch=<e> batch=<b> hash=<h>``: the training function (re)starts after the state was synced;
  ranks of one round print the same size, epoch and batch, and must print the same hash.
- ``DONE size=<n> hash=<h> seen=<json>``: the end; ``seen`` is the committed record of processed indices per epoch.
- ``LEAKS reset=<k> fds=<n> threads=<n> shm=<n>``: with ``RESETS``, this process's resources after reset k.

Knobs: ``EPOCHS``, ``BATCH``, ``COMMIT_EVERY`` (batches), ``STEP_SLEEP`` (s); ``KILL_HOST`` + ``KILL_AT`` + ``MARKER``:
the worker on that host SIGKILLs itself at that global step, once per marker file; ``GROW_AT`` / ``SHRINK_AT`` +
``HOSTS_FILE`` + ``EXTRA_HOST``: rank 0 appends / removes that line of the discovery's hosts file at that step;
``RESETS``: raise HostsUpdatedInterrupt at every step until that many resets happened (for the leak test);
``PROGRESS_FILE``: rank 0 writes ``<global step> <size>`` there after every step (for tests that act from outside);
``END_AFTER_REGROW``: once the job has shrunk and grown again, it ends that many steps after the regrown round
starts (``EPOCHS`` is then only an upper bound), so that a test of a rejoin does not train out the epochs it
needed as headroom.
"""
import hashlib
import json
import os
import signal
import threading
import time

import torch

import horovod.torch as hvd
from horovod.common.exceptions import HostsUpdatedInterrupt

EPOCHS = int(os.environ.get("EPOCHS", "2"))
BATCH = int(os.environ.get("BATCH", "4"))
SAMPLES = int(os.environ.get("SAMPLES", "96"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "2"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
RESETS = int(os.environ.get("RESETS", "0"))
END_AFTER_REGROW = int(os.environ.get("END_AFTER_REGROW", "0"))


def model_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def resources() -> str:
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as maps:
        shm = sum(1 for line in maps if "/dev/shm/horovod" in line)
    return f"fds={fds} threads={threading.active_count()} shm={shm}"


def edit_hosts(add: bool) -> None:
    path, line = os.environ["HOSTS_FILE"], os.environ["EXTRA_HOST"]
    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.strip() and ln.strip() != line]
    if add:
        lines.append(line)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def maybe_act(state) -> None:
    """The test's interventions, at the global step they are asked for."""
    step = state.global_step
    kill_host = os.environ.get("KILL_HOST")
    marker = os.environ.get("MARKER", "")
    if kill_host and os.environ.get("HOROVOD_HOSTNAME") == kill_host and step == int(os.environ["KILL_AT"]) \
            and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if hvd.rank() == 0 and step == int(os.environ.get("GROW_AT", "-1")):
        edit_hosts(add=True)
    if hvd.rank() == 0 and step == int(os.environ.get("SHRINK_AT", "-1")):
        edit_hosts(add=False)


def note_regrowth(state) -> None:
    """With ``END_AFTER_REGROW``: at the start of a round larger than the smallest seen so far, set the step at
    which the job ends. Every rank of the round decides alike, from the state rank 0 synced to all of them."""
    if not END_AFTER_REGROW:
        return
    if state.smallest and hvd.size() > state.smallest and state.end_at < 0:
        state.end_at = state.global_step + END_AFTER_REGROW
    state.smallest = min(state.smallest or hvd.size(), hvd.size())


def main() -> None:
    hvd.init()
    torch.manual_seed(0)
    features = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
    targets = features.sum(dim=1, keepdim=True)
    dataset = torch.utils.data.TensorDataset(torch.arange(SAMPLES), features, targets)
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, global_step=0, seen={},
                                   smallest=0, end_at=-1)
    resets = [0]                            # this process's resets (not state: a restore would undo the count)
    state.register_reset_callbacks([lambda: resets.__setitem__(0, resets[0] + 1)])

    @hvd.elastic.run
    def train(state):
        print(f"START size={hvd.size()} epoch={state.epoch} batch={state.batch} hash={model_hash(model)}",
              flush=True)
        note_regrowth(state)
        if RESETS and resets[0] in (5, RESETS):
            hvd.barrier()                   # every engine is up: no rank has left for the next reset yet
            print(f"LEAKS reset={resets[0]} {resources()}", flush=True)
            hvd.barrier()
        while state.epoch < EPOCHS:
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
            for index, x, y in loader:
                if RESETS and resets[0] < RESETS:
                    raise HostsUpdatedInterrupt(False)
                maybe_act(state)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                everyone = hvd.allgather_object(index.tolist(), name="indices")
                state.seen.setdefault(state.epoch, []).extend(i for part in everyone for i in part)
                state.sampler.record_batch(state.batch, BATCH)
                state.batch += 1
                state.global_step += 1
                if os.environ.get("PROGRESS_FILE") and hvd.rank() == 0:
                    with open(os.environ["PROGRESS_FILE"] + ".tmp", "w") as f:
                        f.write(f"{state.global_step} {hvd.size()}\n")
                    os.replace(os.environ["PROGRESS_FILE"] + ".tmp", os.environ["PROGRESS_FILE"])
                if state.batch % COMMIT_EVERY == 0:
                    state.commit()
                time.sleep(STEP_SLEEP)
                if 0 <= state.end_at <= state.global_step:
                    state.epoch = EPOCHS            # every rank holds the same synced state: all end together
                    break
            state.batch = 0
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
        return state

    train(state)
    print(f"DONE size={hvd.size()} hash={model_hash(model)} seen={json.dumps(state.seen)}", flush=True)


if __name__ == "__main__":
    main()
