"""The PyTorch examples: digits trains on 2 ranks with rank-0-only checkpoints; the synthetic
benchmark prints upstream's report lines."""
import re
import sys

import pytest

from tests.support.examples import assert_digits_report, assert_synthetic_report
from tests.support.launch import horovodrun

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

# Seeded, this run (seed 42) reaches 98.00 % on the reference VM; seeds 0-9 reach 97.56-98.89 %. Other CPUs'
# arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower of those,
# rounded down.
MIN_ACCURACY = 94.0


def _digits(folder, *args: str):
    """Run the digits example on 2 ranks for 20 epochs (seed 42), checkpointing into ``folder``; its output."""
    result = horovodrun(2, [sys.executable, "examples/pytorch/pytorch_digits.py", "--epochs", "20",
                            "--checkpoint", str(folder / "digits.pt"), *args], timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    return result


@pytest.fixture(scope="module")
def uncompressed(tmp_path_factory):
    """The uncompressed run, shared by the checkpoint test and the PowerSGD comparison (one job, not two)."""
    folder = tmp_path_factory.mktemp("ckpt")
    return folder, _digits(folder)


def test_pytorch_digits_trains_on_two_ranks(uncompressed):
    folder, result = uncompressed
    assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY)
    assert sorted(p.name for p in folder.iterdir()) == ["digits.pt"], "rank 0 writes one checkpoint"

    import torch

    state = torch.load(folder / "digits.pt", weights_only=False)
    assert state["epoch"] == 19
    assert set(state) == {"epoch", "model", "optimizer"}


# PowerSGD at rank 4 (DDP's powerSGD_hook algorithm, after 50 plain steps of about 440) against the same run
# uncompressed, both seeded (42) on every rank. On the reference VM: 98.00 % uncompressed, 97.78 % with PowerSGD;
# over seeds 0-4 PowerSGD was at most 0.45 points below (docs/compression.md). The margin is the 1.5
# points (about 3 times the largest drop seen).
POWERSGD_MARGIN = 1.5


def test_pytorch_digits_powersgd_is_within_1_5_points_of_uncompressed(uncompressed, tmp_path):
    baseline = assert_digits_report(uncompressed[1].stdout, ranks=2, min_accuracy=MIN_ACCURACY)
    result = _digits(tmp_path, "--compression", "powersgd", "--powersgd-rank", "4")
    compressed = assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY)
    assert "PowerSGDCompressor(matrix_approximation_rank=4" in result.stdout
    assert compressed >= baseline - POWERSGD_MARGIN, (compressed, baseline)


def test_pytorch_synthetic_benchmark_reports_upstream_lines(tmp_path):
    out = tmp_path / "bench.json"
    result = horovodrun(2, [sys.executable, "examples/pytorch/pytorch_synthetic_benchmark.py", "--model", "mlp",
                            "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
                            "--json", str(out)], timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    text = assert_synthetic_report(result.stdout, ranks=2, iters=2, batch_size=32)
    assert re.search(r"^Model: mlp", text, re.M), text
    import json

    numbers = json.loads(out.read_text())
    assert numbers["size"] == 2 and numbers["backend"] == "horovod" and len(numbers["img_sec_per_iter"]) == 2


@pytest.mark.slow
def test_pytorch_synthetic_benchmark_with_adasum():
    result = horovodrun(2, [sys.executable, "examples/pytorch/pytorch_synthetic_benchmark.py", "--model", "mlp",
                            "--use-adasum", "--num-iters", "1", "--num-warmup-batches", "1",
                            "--num-batches-per-iter", "1"], timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_synthetic_report(result.stdout, ranks=2, iters=1, batch_size=32)
