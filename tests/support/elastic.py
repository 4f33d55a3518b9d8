"""What the elastic tests share: a training function shape for the bindings' tests (tests/parallel/test_*_elastic.py)
and, for the job tests (tests/integration/test_elastic*.py), the worker program and readers of its output."""
import json
import re
import time
from collections import defaultdict
from pathlib import Path
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
