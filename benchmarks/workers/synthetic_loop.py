"""Upstream's synthetic-benchmark loop and output lines, framework-free (numpy only, so the MXNet benchmark can use
it in its own venv): warm-up, timed iterations of N steps, "Iter #k: X img/sec per CPU", the mean +- 1.96 std and
the total over the ranks."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np


def run_synthetic(step: Callable[[], None], sync: Callable[[], None], say: Callable[..., None], *,
                  model: str, n_params: int, n_tensors: int, batch_size: int, size: int, num_warmup_batches: int,
                  num_batches_per_iter: int, num_iters: int, extra_lines: Sequence[str] = ()) -> Dict[str, Any]:
    """Time ``step`` as upstream's synthetic benchmarks do (``sync`` waits for the framework's pending work after
    each run of steps) and print upstream's lines through ``say``; returns the figures."""
    def timed(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return time.perf_counter() - start

    say("Model: %s (%.2f M parameters, %d tensors)", model, n_params / 1e6, n_tensors)
    say("Batch size: %d", batch_size)
    say("Number of CPUs: %d", size)
    for line in extra_lines:
        say("%s", line)
    say("Running warmup...")
    timed(num_warmup_batches)
    say("Running benchmark...")
    img_secs: List[float] = []
    for i in range(num_iters):
        img_sec = batch_size * num_batches_per_iter / timed(num_batches_per_iter)
        say("Iter #%d: %.1f img/sec per CPU", i, img_sec)
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    say("Img/sec per CPU: %.1f +-%.1f", mean, conf)
    say("Total img/sec on %d CPU(s): %.1f +-%.1f", size, size * mean, size * conf)
    return {"model": model, "parameters": n_params, "batch_size": batch_size, "size": size,
            "img_sec_per_iter": img_secs, "img_sec_mean": mean, "img_sec_conf": conf, "total_img_sec": size * mean}
