"""benchmarks/cross_host.py's run plan and the ratios it prints, on made-up rows (no hosts are made)."""
import argparse

from benchmarks import cross_host


def row(hosts, config, big_s, small_s):
    result = {"big": [big_s], "small": [small_s], "big_bytes": 64 << 20}
    return {"hosts": hosts, "config": config, "load": "1.0", "result": result}


def test_plan_per_host_count_and_the_default():
    args = argparse.Namespace(plan="2:ring;8:ring,gloo1;4:hier", hosts="2,3", configs="ring,gloo")
    assert cross_host.plan(args) == [(2, ["ring"]), (8, ["ring", "gloo1"]), (4, ["hier"])]
    args.plan = None
    assert cross_host.plan(args) == [(2, ["ring", "gloo"]), (3, ["ring", "gloo"])]


def test_ratios():
    ring, hier = cross_host.CONFIGS["ring"][0], cross_host.CONFIGS["hier"][0]
    bound = 125e6 * 8 / 14                                   # the ring bound's algbw at 8 hosts
    rows = [row(2, ring, 1.0, 100e-6), row(8, ring, (64 << 20) / (0.95 * bound), 250e-6),
            row(8, "torch Gloo (torchrun), 1 rank(s)/host", (64 << 20) / (0.5 * bound), 1e-3),
            row(4, hier, (64 << 20) / (0.9 * 125e6 * 4 / 6), 1e-3)]
    text = "\n".join(cross_host.ratios(rows))
    assert "8 hosts x 1 rank, 64 MB: 95.0% of the ring bound" in text
    assert "8 hosts x 1 rank, 64 MB: 1.90x torch Gloo" in text
    assert "4 hosts x 2 ranks hierarchical, 64 MB: 90.0% of the link" in text
    assert "4 KB, 1 rank/host: 250 µs at 8 hosts / 100 µs at 2 hosts = 2.50x" in text


def test_the_floors_ratio_and_their_rows():
    star = cross_host.FLOORS["pystar"][1]
    rows = [{"hosts": 2, "config": star, "load": "1.0", "result": {"big": [], "small": [40e-6], "big_bytes": 0}},
            {"hosts": 8, "config": star, "load": "1.0", "result": {"big": [], "small": [280e-6], "big_bytes": 0}}]
    assert "4 KB, plain Python star: 280 µs at 8 hosts / 40 µs at 2 hosts = 7.00x" in cross_host.ratios(rows)
    table = cross_host.table(rows)
    assert f"| 8 | {star} | – | – | – | 280 | 1 | 1.0 |" in table
    assert cross_host.config_names("ring,pystar,pyrd") == ["ring", "pystar", "pyrd"]
