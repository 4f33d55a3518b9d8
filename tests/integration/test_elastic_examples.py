"""The elastic examples (examples/elastic) as real elastic jobs: horovodrun with --min-np/--max-np and the
example's host discovery script over a hosts file of two "hosts" on this machine; each trains the digits and
reports its held-out accuracy from rank 0 only."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.examples import assert_digits_report
from tests.support.launch import ROOT, horovodrun

pytest.importorskip("sklearn")

pytestmark = pytest.mark.timeout(240)

DISCOVER = ROOT / "examples" / "elastic" / "discover_hosts.sh"
ELASTIC = ["--min-np", "1", "--max-np", "3", "--host-discovery-script", str(DISCOVER)]
# Seeded (seed 42), the PyTorch example reaches 96.44 % on the reference VM (a run on another machine reached
# 94.44 %, which failed the 95 % this test once asked); seeds 0-9 reach 97.78-98.89 %. The Keras one (seed 42)
# reaches 98.67 %, seeds 0-9 95.33-97.56 %. Each threshold is 3 points below the lower of its figures, rounded
# down.
MIN_ACCURACY_TORCH = 93.0
MIN_ACCURACY_KERAS = 92.0


def hosts_file(tmp_path: Path, text: str = "localhost:1\n127.0.0.1:1\n") -> Path:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def test_discovery_script_prints_the_hosts_without_comments_or_blank_lines(tmp_path):
    path = hosts_file(tmp_path, "# the job's hosts\nlocalhost:2\n\n  127.0.0.1:1   # the second one\n")
    result = subprocess.run([str(DISCOVER)], capture_output=True, text=True, timeout=10,
                            env={**os.environ, "HOROVOD_HOSTS_FILE": str(path)})
    assert result.returncode == 0 and result.stdout.splitlines() == ["localhost:2", "127.0.0.1:1"], result
    missing = subprocess.run([str(DISCOVER)], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "HOROVOD_HOSTS_FILE": str(tmp_path / "none.txt")})
    assert missing.returncode != 0 and "HOROVOD_HOSTS_FILE" in missing.stderr


def test_pytorch_digits_elastic_trains_on_two_ranks(tmp_path):
    pytest.importorskip("torch")
    result = horovodrun(2, [sys.executable, "examples/elastic/pytorch_digits_elastic.py", "--epochs", "10",
                            "--batches-per-commit", "3"], extra_args=ELASTIC,
                        env={"HOROVOD_HOSTS_FILE": str(hosts_file(tmp_path))}, timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY_TORCH)
    epochs = re.findall(r"\[0\]<stderr>:epoch (\d+)/10: loss [\d.]+ on 2 workers", result.stdout)
    assert epochs == [str(e) for e in range(1, 11)], result.stdout[-5000:]


def test_keras_digits_elastic_trains_on_two_ranks(tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    result = horovodrun(2, [sys.executable, "examples/elastic/keras_digits_elastic.py", "--epochs", "10"],
                        extra_args=ELASTIC, timeout=180,
                        env={"HOROVOD_HOSTS_FILE": str(hosts_file(tmp_path)), "KERAS_BACKEND": "tensorflow",
                             "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout[-5000:]
    assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY_KERAS)
    assert re.search(r"\[0\]<stderr>:training epochs 1 to 10 on 2 workers", result.stdout)
    assert re.search(r"\[0\]<stdout>:Epoch 10/10", result.stdout), "rank 0 shows progress"
    assert not re.search(r"\[1\]<stdout>:Epoch", result.stdout), "only rank 0 shows progress"
