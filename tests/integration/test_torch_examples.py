"""The PyTorch examples: digits trains to >= 95% on 2 ranks with rank-0-only checkpoints; the synthetic
benchmark prints upstream's report lines."""
import re
import sys

import pytest

from tests.support.launch import horovodrun

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")


def test_pytorch_digits_trains_on_two_ranks(tmp_path):
    checkpoint = tmp_path / "ckpt" / "digits.pt"
    result = horovodrun(2, [sys.executable, "examples/pytorch/pytorch_digits.py", "--epochs", "20",
                            "--checkpoint", str(checkpoint)], timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    match = re.search(r"\[0\]<stderr>:test accuracy on (\d+) held-out digits: ([\d.]+)% \(2 ranks\)", result.stdout)
    assert match, result.stdout[-3000:]
    assert int(match.group(1)) == 450
    assert float(match.group(2)) >= 95.0
    assert "[1]<stderr>:test accuracy" not in result.stdout, "only rank 0 reports"
    assert not re.search(r"\[1\]<stderr>:epochs:", result.stdout), "only rank 0 shows a progress bar"
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["digits.pt"], "rank 0 writes one checkpoint"

    import torch

    state = torch.load(checkpoint, weights_only=False)
    assert state["epoch"] == 19
    assert set(state) == {"epoch", "model", "optimizer"}


def test_pytorch_synthetic_benchmark_reports_upstream_lines(tmp_path):
    out = tmp_path / "bench.json"
    result = horovodrun(2, [sys.executable, "examples/pytorch/pytorch_synthetic_benchmark.py", "--model", "mlp",
                            "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
                            "--json", str(out)], timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    lines = [line.split(":", 1)[1] for line in result.stdout.splitlines() if line.startswith("[0]<stderr>:")]
    text = "\n".join(lines)
    assert re.search(r"^Model: mlp", text, re.M), text
    assert "Batch size: 32" in lines
    assert "Number of CPUs: 2" in lines
    assert "Running warmup..." in lines and "Running benchmark..." in lines
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", text, re.M)) == 2, text
    assert re.search(r"^Img/sec per CPU: [\d.]+ \+-[\d.]+$", text, re.M), text
    assert re.search(r"^Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+$", text, re.M), text
    assert not any(line.startswith("[1]<stderr>:Iter") for line in result.stdout.splitlines()), "rank 0 only"
    import json

    numbers = json.loads(out.read_text())
    assert numbers["size"] == 2 and numbers["backend"] == "horovod" and len(numbers["img_sec_per_iter"]) == 2


def test_pytorch_synthetic_benchmark_adasum_is_clearly_unavailable():
    result = horovodrun(1, [sys.executable, "examples/pytorch/pytorch_synthetic_benchmark.py", "--model", "mlp",
                            "--use-adasum", "--num-iters", "1"], timeout=120)
    assert result.returncode != 0
    assert "NotImplementedError" in result.stdout and "Adasum" in result.stdout
