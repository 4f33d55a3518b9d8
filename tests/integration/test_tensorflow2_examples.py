"""The TensorFlow 2 examples: digits trains on 2 ranks with rank-0-only reporting and checkpoints; the
synthetic benchmark prints upstream's report lines, with the default op and with Adasum."""
import json
import re
import sys

import pytest

from tests.support.examples import assert_digits_report, assert_synthetic_report
from tests.support.launch import horovodrun

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

BENCH = "examples/tensorflow2/tensorflow2_synthetic_benchmark.py"
# Seeded, the digits run (seed 42) reaches 98.89 % on the reference VM; seeds 0-9 reach 97.78-98.89 %. Other
# CPUs' arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower of
# those, rounded down.
MIN_ACCURACY = 94.0


def test_tensorflow2_digits_trains_on_two_ranks(tmp_path):
    checkpoint = tmp_path / "ckpt" / "digits"
    result = horovodrun(2, [sys.executable, "examples/tensorflow2/tensorflow2_digits.py", "--epochs", "20",
                            "--checkpoint", str(checkpoint)], timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY)
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["digits.data-00000-of-00001", "digits.index"], \
        "rank 0 writes one checkpoint"

    reader = tf.train.load_checkpoint(str(checkpoint))
    assert reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE") == 19
    assert any(k.startswith("optimizer/") for k in reader.get_variable_to_shape_map()), "optimizer state is saved"


@pytest.mark.slow      # the quick tier trains the TF2 digits example
def test_tensorflow2_synthetic_benchmark_reports_upstream_lines(tmp_path):
    out = tmp_path / "bench.json"
    result = horovodrun(2, [sys.executable, BENCH, "--batch-size", "8", "--num-warmup-batches", "1",
                            "--num-batches-per-iter", "2", "--num-iters", "2", "--json", str(out)], timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    text = assert_synthetic_report(result.stdout, ranks=2, iters=2, batch_size=8)
    assert re.search(r"^Model: cnn \(4\.59 M parameters, 12 tensors\)$", text, re.M), text

    numbers = json.loads(out.read_text())
    assert numbers["size"] == 2 and numbers["backend"] == "horovod" and len(numbers["img_sec_per_iter"]) == 2
    assert numbers["model"] == "cnn" and numbers["batch_size"] == 8 and numbers["total_img_sec"] > 0


@pytest.mark.slow
def test_tensorflow2_synthetic_benchmark_with_adasum():
    result = horovodrun(2, [sys.executable, BENCH, "--model", "mlp", "--use-adasum", "--batch-size", "8",
                            "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "1"],
                        timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_synthetic_report(result.stdout, ranks=2, iters=1, batch_size=8)
