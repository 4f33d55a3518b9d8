"""What the elastic tests share: a training function shape for the bindings' tests (tests/parallel/test_*_elastic.py)
and, for the job tests (tests/integration/test_elastic*.py), the worker programs and readers of their output, and
for the TensorFlow 2 twin of upstream's tests (test_elastic_tf2.py) upstream's epoch-scheduled discovery script and
a launcher whose driver polls it faster."""
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

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


WORKER = str(Path(__file__).resolve().parents[1] / "integration" / "workers" / "elastic_train.py")
LINE = re.compile(r"^\[(\d+)\]<stdout>:(START|DONE|LEAKS) (.*)$", re.M)


def events(output: str, kind: str):
    """The ``kind`` lines as dicts of their ``key=value`` fields (``seen`` parsed as JSON)."""
    found = []
    for rank, what, rest in LINE.findall(output):
        if what != kind:
            continue
        fields = {"rank": int(rank)}
        head, _, seen = rest.partition(" seen=")
        for item in head.split():
            key, _, value = item.partition("=")
            fields[key] = value
        if seen:
            fields["seen"] = json.loads(seen)
        found.append(fields)
    return found


def assert_same_model_after_every_reset(output: str) -> None:
    """Ranks that start a round from the same committed position hold bit-identical models."""
    rounds = defaultdict(set)
    for start in events(output, "START"):
        rounds[(start["size"], start["epoch"], start["batch"])].add(start["hash"])
    assert rounds, output
    for key, hashes in rounds.items():
        assert len(hashes) == 1, f"ranks started {key} with different models: {hashes}\n{output}"
    finals = {done["hash"] for done in events(output, "DONE")}
    assert len(finals) == 1, output


def assert_each_sample_once_per_epoch(output: str, samples: int, epochs: int) -> None:
    """The committed record of every epoch covers every sample, repeating only the last batch's padding."""
    for done in events(output, "DONE"):
        for epoch in range(epochs):
            seen = done["seen"][str(epoch)]
            assert set(seen) == set(range(samples)), f"epoch {epoch} missed samples\n{output}"
            assert len(seen) - samples < int(done["size"]) * 4, f"epoch {epoch} repeated samples\n{output}"


def read_progress(path: Path) -> Tuple[int, int]:
    """(step, size) that an elastic job's worker last wrote to ``path`` ("<step> <size>"); (-1, 0) before it did."""
    try:
        step, size = path.read_text().split()
        return int(step), int(size)
    except (OSError, ValueError):
        return -1, 0


def wait_for(what: str, condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def discovery_script(folder: Path, addresses: List[str]) -> Tuple[Path, Path]:
    """A host discovery script that prints ``folder/hosts.txt``, which starts as one slot on each of
    ``addresses``; returns (the hosts file, which a test rewrites to add or remove hosts, the script)."""
    hosts_file = folder / "hosts.txt"
    hosts_file.write_text("".join(f"{address}:1\n" for address in addresses))
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return hosts_file, script


TF2_WORKER = str(Path(__file__).resolve().parents[1] / "integration" / "workers" / "elastic_tensorflow2_main.py")
# ``python -m horovod.runner`` with the driver's discovery period (``DISCOVER_HOSTS_FREQUENCY_SECS``, 1 s, no knob)
# set from the environment, as upstream's integration tests patch it (to 10 ms there).
_POLLING_LAUNCHER = ("import os, horovod.runner.elastic.driver as driver; "
                     "driver.DISCOVER_HOSTS_FREQUENCY_SECS = float(os.environ['TEST_DISCOVERY_SECS']); "
                     "from horovod.runner.launch import run_commandline; run_commandline()")


def horovodrun_polling(np: int, command: List[str], extra_args: List[str], env: Dict[str, str], timeout: float,
                       discovery_secs: float = 0.1) -> subprocess.CompletedProcess:
    """:func:`tests.support.launch.horovodrun` whose elastic driver polls the host discovery every
    ``discovery_secs`` (upstream's tests poll every 10 ms: the script runs 100 times a second, which on a 2-core
    machine made a job take three times as long)."""
    from tests.support.launch import _job_env, _run_job

    args = [sys.executable, "-c", _POLLING_LAUNCHER, "-np", str(np), *extra_args, *command]
    return _run_job(args, _job_env({**env, "TEST_DISCOVERY_SECS": str(discovery_secs)}), timeout,
                    f"{np}-rank elastic job", command)


def schedule_discovery_script(folder: Path, logfile: Path, schedule: List[Tuple[Optional[int], List[str]]]) -> Path:
    """Upstream's discovery script for a ``schedule`` of ``(epoch, hosts)`` pairs, the last one's epoch ``None``
    (every later epoch): the epoch is the number of lines in ``logfile`` (the worker's rank 0 appends one per epoch
    it finished)."""
    lines = ["#!/bin/sh", "epoch=0", f"[ -f '{logfile}' ] && epoch=$(wc -l < '{logfile}' | tr -d '[:space:]')"]
    for index, (epoch, hosts) in enumerate(schedule):
        if epoch is not None:
            lines.append(f'{"elif" if index else "if"} [ "$epoch" = "{epoch}" ]; then')
        elif index:
            lines.append("else")
        lines += [f"  echo '{host}'" for host in hosts]
    if len(schedule) > 1:
        lines.append("fi")
    script = folder / "discover.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


def log_lines(logfile: Path) -> List[dict]:
    """The worker's per-epoch JSON lines (``elastic_tensorflow2_main.py --logfile``); [] before the first."""
    return [json.loads(line) for line in logfile.read_text().splitlines() if line.strip()] if logfile.exists() else []
