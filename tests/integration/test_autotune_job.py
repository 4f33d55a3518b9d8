"""Autotune end to end: rank 0 tunes, every rank applies the values at the same point, results stay right."""
import csv
import sys

import pytest

from tests.support.launch import ROOT, horovodrun, rank_lines

pytestmark = pytest.mark.timeout(240)
WORKER = ROOT / "tests" / "integration" / "workers" / "autotune_steps.py"
FAST = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "3", "HOROVOD_LOG_LEVEL": "INFO"}


@pytest.mark.parametrize("np_", [2, 3])
def test_autotune_finishes_writes_its_log_and_every_result_is_right(tmp_path, np_):
    log_file = tmp_path / "autotune.csv"
    result = horovodrun(np_, [sys.executable, str(WORKER)], timeout=180,
                        env={**FAST, "HOROVOD_AUTOTUNE_LOG": str(log_file)})
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    tuned = [line.split() for r in range(np_) for line in rank_lines(out, r) if line.startswith("TUNED")]
    assert len(tuned) == np_, out[-3000:]
    assert len({t[1] for t in tuned}) == 1, tuned                     # every rank stopped at the same step
    assert len({(t[3], t[4]) for t in tuned}) == 1, tuned             # same cycle time and cache state
    rows = list(csv.reader(log_file.read_text().splitlines()))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled",
                       "cycle_time_ms", "tensor_fusion_threshold", "score"]
    scored = rows[1:-1]
    assert len(scored) >= 3 + 2, rows                                 # Bayesian points, then the cache on/off
    assert {r[3].strip() for r in scored} == {"0", "1"}, rows         # the cache really was switched
    # The last stage measures the cache on and off at the best values found; the winner is the final row.
    best, cache_rows = rows[-1], scored[-2:]
    assert {r[3].strip() for r in cache_rows} == {"0", "1"}, rows
    winner = max(cache_rows, key=lambda r: float(r[-1]))
    assert [x.strip() for x in best] == [x.strip() for x in winner], rows
    assert any("Autotuner: Best params" in line for line in rank_lines(out, 0)), out[-3000:]


def test_explicit_values_are_not_tuned(tmp_path):
    log_file = tmp_path / "autotune.csv"
    env = {**FAST, "HOROVOD_AUTOTUNE_LOG": str(log_file), "HOROVOD_FUSION_THRESHOLD": str(2 << 20),
           "HOROVOD_CYCLE_TIME": "3"}
    result = horovodrun(2, [sys.executable, str(WORKER)], timeout=180, env=env)
    assert result.returncode == 0, result.stdout[-5000:]
    rows = list(csv.reader(log_file.read_text().splitlines()))[1:]
    assert rows and all(r[4] == "3" and r[5] == "2" for r in rows), rows
    tuned = [line.split() for line in rank_lines(result.stdout, 0) if line.startswith("TUNED")]
    assert tuned[0][2] == str(2 << 20) and float(tuned[0][3]) == 3.0, tuned
