"""``python -m horovod.bench`` end to end, through the launchers a user would use: every op at sizes that do not
divide by the rank count, this project alone at 1 rank, beside torch Gloo at 3 ranks (in the same processes),
and beside mpi4py under ``horovodrun --mpi``. Each job has a hard timeout that dumps the ranks' stacks."""
import json
import sys

import pytest

from tests.support.launch import horovodrun, mpi_missing

OPS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]
SIZES = [4096, 100_000]       # 100 000 B = 25 000 floats: not a multiple of 3 ranks' parts


def bench(np_, tmp_path, peers, extra_args=()):
    out = tmp_path / "bench.json"
    proc = horovodrun(np_, [sys.executable, "-m", "horovod.bench", "--ops", ",".join(OPS), "--sizes",
                            ",".join(map(str, SIZES)), "--iters", "3", "--peers", ",".join(peers), "--json",
                            str(out)], extra_args=extra_args, timeout=180)
    assert proc.returncode == 0, proc.stdout
    return json.loads(out.read_text()), proc.stdout


def check(figures, np_, peers, stdout):
    assert figures["ranks"] == np_
    assert list(figures["results"]) == peers
    for peer in peers:
        for op in OPS:
            for nbytes in SIZES:
                got = figures["results"][peer][op][str(nbytes)]
                assert got is not None and got["seconds"] > 0, (peer, op, nbytes, got)
                assert got["algbw_GBps"] == pytest.approx(nbytes / got["seconds"] / 1e9)
    for op in OPS:
        assert f"# {op}, {np_} ranks, float32" in stdout
    assert stdout.count("# allreduce,") == 1        # rank 0 alone prints


def test_alone_at_one_rank(tmp_path):
    figures, stdout = bench(1, tmp_path, ["horovod"])
    check(figures, 1, ["horovod"], stdout)


def test_beside_gloo_at_three_ranks_and_mpi4py_outside_mpi_is_skipped_with_the_way_to_get_it(tmp_path):
    pytest.importorskip("torch")
    figures, stdout = bench(3, tmp_path, ["horovod", "mpi4py", "gloo"])
    check(figures, 3, ["horovod", "gloo"], stdout)
    assert "gloo/ours" in stdout
    assert "mpi4py skipped: start the job with `horovodrun --mpi` or `mpirun`" in stdout


def test_beside_mpi4py_under_horovodrun_mpi(tmp_path):
    if mpi_missing():
        pytest.skip(mpi_missing())
    figures, stdout = bench(2, tmp_path, ["horovod", "mpi4py"], extra_args=["--mpi"])
    check(figures, 2, ["horovod", "mpi4py"], stdout)
