"""Regenerate ``timeline_sample.json``: a made-up 4-rank training timeline in the writer's format.

Six training steps of a small model: a broadcast of the model state first, then per step two fused gradient
allreduces and an allgather of the loss. Rank 2 is usually late (slow input pipeline), so it shows up as the
straggler. Run ``python tests/unit/data/make_timeline_sample.py`` to rewrite the file; the output is deterministic.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

RANKS = 4
STEPS = 6
SIZES_MB = {"allreduce.fc1.bias": 0.002, "allreduce.fc1.weight": 4.0, "allreduce.conv2.weight": 1.2,
            "allreduce.conv1.weight": 0.05}
SHAPES = {"allreduce.fc1.bias": "[512]", "allreduce.fc1.weight": "[512, 2048]",
          "allreduce.conv2.weight": "[128, 64, 3, 3]", "allreduce.conv1.weight": "[64, 3, 7, 7]",
          "broadcast.model_state": "[1310720]", "allgather.loss": "[1]"}


class Writer:
    def __init__(self) -> None:
        self.events: List[dict] = [
            {"name": "process_name", "ph": "M", "pid": 0,
             "args": {"name": "Horovod", "start_time_since_epoch_in_micros": 1_767_261_600_000_000}},
            {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}]
        self.pids: Dict[str, int] = {}

    def pid(self, name: str) -> int:
        if name not in self.pids:
            pid = self.pids[name] = len(self.pids) + 1
            self.events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
                            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
        return self.pids[name]

    def negotiate(self, name: str, kind: str, ticks: Dict[int, float]) -> float:
        pid = self.pid(name)
        order = sorted(ticks.items(), key=lambda item: item[1])
        self.events.append({"ph": "B", "name": f"NEGOTIATE_{kind}", "ts": order[0][1], "pid": pid})
        self.events += [{"ph": "X", "name": str(rank), "ts": ts, "pid": pid, "dur": 0} for rank, ts in order]
        self.events.append({"ph": "E", "ts": order[-1][1], "pid": pid})
        return order[-1][1]

    def op(self, names: Sequence[str], kind: str, start: float, steps: Sequence[Tuple[str, float]]) -> float:
        self.events.append({"ph": "i", "name": "CYCLE_START", "ts": start, "s": "g"})
        pids = [self.pid(name) for name in names]
        self.events += [{"ph": "B", "name": kind, "ts": start, "pid": pid} for pid in pids]
        now = start
        for activity, duration in steps:
            self.events += [{"ph": "B", "name": activity, "ts": now, "pid": pid} for pid in pids]
            now = round(now + duration, 1)
            self.events += [{"ph": "E", "ts": now, "pid": pid} for pid in pids]
        now = round(now + 15, 1)
        self.events += [{"ph": "E", "ts": now, "pid": pid, "args": {"dtype": "float32", "shape": SHAPES[name]}}
                        for pid, name in zip(pids, names)]
        return now


def ticks(rng: random.Random, at: float, late: Dict[int, float]) -> Dict[int, float]:
    return {rank: round(at + rng.uniform(0, 250) + late.get(rank, 0.0), 1) for rank in range(RANKS)}


def build() -> List[dict]:
    rng = random.Random(7)
    out = Writer()
    ready = out.negotiate("broadcast.model_state", "BROADCAST", ticks(rng, 1000, {}))
    out.op(["broadcast.model_state"], "BROADCAST", ready + 80, [("SHM_BCAST", 3900)])
    for step in range(STEPS):
        start = 20_000 + 60_000 * step
        late = {2: rng.uniform(1500, 4000)} if rng.random() < 0.8 else {rng.randrange(RANKS): rng.uniform(0, 600)}
        for offset, group in ((2000, ["allreduce.fc1.bias", "allreduce.fc1.weight"]),
                              (9000, ["allreduce.conv2.weight", "allreduce.conv1.weight"])):
            ready = max(out.negotiate(name, "ALLREDUCE", ticks(rng, start + offset, late)) for name in group)
            megabytes = sum(SIZES_MB[name] for name in group)
            out.op(group, "ALLREDUCE", round(ready + rng.uniform(40, 120), 1),
                   [("QUEUE", round(rng.uniform(20, 90), 1)), ("MEMCPY_IN_FUSION_BUFFER", round(180 * megabytes, 1)),
                    ("SHM_ALLREDUCE", round(600 * megabytes + 60, 1)),
                    ("MEMCPY_OUT_FUSION_BUFFER", round(170 * megabytes, 1))])
        ready = out.negotiate("allgather.loss", "ALLGATHER", ticks(rng, start + 16_000, {}))
        out.op(["allgather.loss"], "ALLGATHER", round(ready + 50, 1), [("ALLOCATE_OUTPUT", 6.0), ("SHM_ALLGATHER", 45.0)])
    return out.events


def main() -> None:
    path = Path(__file__).with_name("timeline_sample.json")
    path.write_text("[\n" + ",\n".join(json.dumps(event, separators=(",", ":")) for event in build()) + "\n]\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
