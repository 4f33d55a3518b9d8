"""horovod.bench's arithmetic and table, in one process: sizes, nccl-tests' bus factors, the ratio column."""
import pytest

from horovod.bench import cli, report


@pytest.mark.parametrize("text, expected", [("4096", 4096), ("4K", 4096), ("64M", 64 << 20), ("1G", 1 << 30),
                                            ("1.5K", 1536), ("256mb", 256 << 20)])
def test_sizes_read_as_nccl_tests_writes_them(text, expected):
    assert report.parse_size(text) == expected


def test_sizes_between_steps_by_the_factor_and_stops_at_the_top():
    assert report.sizes_between(4096, 64 << 20, 4) == [4096 << (2 * i) for i in range(8)]
    assert report.sizes_between(1000, 5000, 2) == [1000, 2000, 4000]
    with pytest.raises(ValueError, match="step factor"):
        report.sizes_between(4096, 1024, 2)


@pytest.mark.parametrize("op, n, factor", [("allreduce", 4, 1.5), ("allgather", 4, 0.75), ("broadcast", 3, 1.0),
                                           ("reducescatter", 3, 2 / 3), ("alltoall", 2, 0.5), ("allreduce", 1, 0.0)])
def test_busbw_is_algbw_times_nccl_tests_factor(op, n, factor):
    seconds = 1e-3
    _, algbw, busbw = report.columns(1 << 20, seconds, op, n)
    assert float(algbw) == pytest.approx((1 << 20) / seconds / 1e9, abs=1e-3)
    assert float(busbw) == pytest.approx(float(algbw) * factor, abs=1e-3)


def test_the_table_gives_each_peer_its_columns_and_the_ratio_to_ours():
    results = {"horovod": {"allreduce": {4096: 10e-6, 1 << 20: 200e-6}},
               "gloo": {"allreduce": {4096: 40e-6, 1 << 20: None}}}
    lines = report.table(results, 2).splitlines()
    assert lines[0].startswith("# allreduce, 2 ranks")
    assert "horovod time" in lines[1] and "gloo time" in lines[1] and "gloo/ours" in lines[1]
    small = lines[2].split()
    assert small[:3] == ["4096", "1024", "float"] and small[3] == "10.0" and small[-1] == "4.00"
    big = lines[3].split()
    assert big[3] == "200.0" and big[-4:] == ["-", "-", "-", "-"]      # gloo lacks it: no time, no ratio


def test_unknown_ops_are_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--ops", "allreduce,allscatter"])
    err = capsys.readouterr().err
    assert "unknown op(s) allscatter" in err and "reducescatter" in err


def test_the_default_sweep_is_4k_to_64m_by_4():
    args = cli.parse_args([])
    assert args.sizes[0] == 4096 and args.sizes[-1] == 64 << 20 and len(args.sizes) == 8
    assert args.ops == ["allreduce", "allgather", "broadcast", "reducescatter"] and args.peers == ["horovod"]
