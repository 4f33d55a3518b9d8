"""The README's main job: the numpy digits example trains to a held-out accuracy on 2 ranks."""
import re
import sys

import pytest

from tests.support.launch import horovodrun

pytest.importorskip("sklearn")

# Seeded, this run (seed 0) reaches 97.56 % on the reference VM; seeds 0-9 reach 96.89-98.00 %. Other CPUs'
# arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower of those,
# rounded down.
MIN_ACCURACY = 93.0


def test_numpy_digits_trains_on_two_ranks(tmp_path):
    checkpoint = tmp_path / "ckpt.npz"
    result = horovodrun(2, [sys.executable, "examples/numpy/numpy_digits.py", "--epochs", "25",
                            "--checkpoint", str(checkpoint)], timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    match = re.search(r"\[0\]<stderr>:test accuracy on (\d+) held-out digits: ([\d.]+)% \(2 ranks\)", result.stdout)
    assert match, result.stdout[-3000:]
    assert int(match.group(1)) == 450
    assert float(match.group(2)) >= MIN_ACCURACY, match.group(0)
    assert checkpoint.exists(), "rank 0 writes the checkpoint"
    assert "[1]<stderr>:test accuracy" not in result.stdout, "only rank 0 reports"
