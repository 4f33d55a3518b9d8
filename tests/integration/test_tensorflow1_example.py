"""The TF1 (graph mode) example: upstream's README program on the digits data trains on 2 ranks, with
the broadcast hook, MonitoredTrainingSession and checkpoints written by rank 0 only."""
import re
import sys

import pytest

from tests.support.launch import horovodrun

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# Seeded, this run (seed 42) reaches 97.78 % on the reference VM; seeds 0-9 reach 95.78-97.33 %. Other CPUs'
# arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower of those,
# rounded down.
MIN_ACCURACY = 92.0


def test_tensorflow_digits_trains_on_two_ranks(tmp_path):
    checkpoints = tmp_path / "ckpt"
    result = horovodrun(2, [sys.executable, "examples/tensorflow/tensorflow_digits.py", "--steps", "1000",
                            "--checkpoint-dir", str(checkpoints)], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    match = re.search(r"\[0\]<stderr>:test accuracy on (\d+) held-out digits: ([\d.]+)% \(2 ranks\)", result.stdout)
    assert match, result.stdout[-3000:]
    assert int(match.group(1)) == 450, "the ranks' test shards add up to the whole test set"
    assert float(match.group(2)) >= MIN_ACCURACY, match.group(0)
    assert "[1]<stderr>:test accuracy" not in result.stdout, "only rank 0 reports"
    assert not re.search(r"\[1\]<stderr>:.*Saving checkpoints", result.stdout), "only rank 0 saves"
    assert re.search(r"\[0\]<stderr>:.*Saving checkpoints for 500 into", result.stdout), result.stdout[-3000:]

    import tensorflow as tf

    # 1000 steps divided among 2 ranks; the one events file shows there was one writer.
    assert tf.train.latest_checkpoint(str(checkpoints)).endswith("model.ckpt-500")
    assert len(list(checkpoints.glob("events.out.tfevents.*"))) == 1
    reader = tf.train.load_checkpoint(str(checkpoints))
    assert reader.get_tensor("global_step") == 500
    assert reader.get_variable_to_shape_map()["fc2"] == [128, 10]
