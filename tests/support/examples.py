"""Checks shared by the example tests (any framework): the digits examples' accuracy line and upstream's synthetic
benchmark report, both printed by rank 0 only, as logging lines on stderr under horovodrun."""
from __future__ import annotations

import re

from tests.support.launch import rank_lines


def assert_digits_report(stdout: str, *, ranks: int, min_accuracy: float, held_out: int = 450) -> float:
    """Rank 0, and no other rank, reports the test accuracy on the held-out digits, at least ``min_accuracy`` (in
    %, each caller's threshold with its margin stated); returns it (in %)."""
    match = re.search(rf"\[0\]<stderr>:test accuracy on (\d+) held-out digits: ([\d.]+)% \({ranks} ranks\)", stdout)
    assert match, stdout[-3000:]
    assert int(match.group(1)) == held_out
    accuracy = float(match.group(2))
    assert accuracy >= min_accuracy, f"{match.group(0)}: below the test's threshold of {min_accuracy} %"
    assert not re.search(r"\[[1-9]\d*\]<stderr>:test accuracy", stdout), "only rank 0 reports"
    assert not re.search(r"\[[1-9]\d*\]<stderr>:epochs:", stdout), "only rank 0 shows a progress bar"
    return accuracy


def assert_synthetic_report(stdout: str, ranks: int, iters: int, batch_size: int) -> str:
    """Rank 0, and no other rank, prints upstream's synthetic benchmark lines; returns rank 0's output."""
    lines = rank_lines(stdout, 0)
    text = "\n".join(lines)
    assert re.search(r"^Model: \S+", text, re.M), text
    assert f"Batch size: {batch_size}" in lines, text
    assert f"Number of CPUs: {ranks}" in lines, text
    assert "Running warmup..." in lines and "Running benchmark..." in lines, text
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", text, re.M)) == iters, text
    assert re.search(r"^Img/sec per CPU: [\d.]+ \+-[\d.]+$", text, re.M), text
    assert re.search(rf"^Total img/sec on {ranks} CPU\(s\): [\d.]+ \+-[\d.]+$", text, re.M), text
    assert not any(line.startswith("Iter") for r in range(1, ranks) for line in rank_lines(stdout, r)), "rank 0 only"
    return text
