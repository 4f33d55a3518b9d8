"""An elastic job across namespace hosts (tests/support/hosts.py): workers over real ssh, a host's link cut
mid-training and restored.

Needs root, iproute2 and openssh-server: elsewhere it skips with the reason; under ``.ci/run``
(HOROVOD_TEST_REQUIRE_HOSTS=1) it fails instead.
"""
import datetime
import re
import sys
import threading

import pytest

from tests.support.elastic import (
    WORKER,
    assert_same_model_after_every_reset,
    discovery_script,
    events,
    read_progress,
    wait_for,
)
from tests.support.hosts import hosts_or_skip
from tests.support.launch import horovodrun

# The workers' log lines carry their local time: "[2026-11-24 10:11:36,338] [horovod WARNING rank 0] ...".
FAILED_COLLECTIVE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[horovod WARNING rank \d+\] "
                               r"a collective failed")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cut_link_fails_the_host_over_and_it_rejoins_after_the_cooldown(tmp_path):
    with hosts_or_skip(3) as cluster:
        _, script = discovery_script(tmp_path, [host.address for host in cluster.hosts])
        progress = tmp_path / "progress"
        victim = cluster.hosts[2]
        seen = {}

        def cut_then_restore() -> None:
            wait_for("step 5", lambda: read_progress(progress)[0] >= 5)
            victim.cut()
            seen["cut"] = datetime.datetime.now()
            wait_for("the job at size 2", lambda: read_progress(progress)[1] == 2)
            victim.restore()
            seen["restored"] = datetime.datetime.now()

        intervention = threading.Thread(target=cut_then_restore, daemon=True)
        intervention.start()
        env = cluster.launcher_env({"EPOCHS": "40", "END_AFTER_REGROW": "12", "STEP_SLEEP": "0.1",
                                     "PROGRESS_FILE": str(progress)})
        args = ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
                "--blacklist-cooldown-range", "3", "5", *cluster.launcher_args()]
        try:
            with cluster.dump_stacks_after(230):
                result = horovodrun(3, [sys.executable, WORKER], extra_args=args, env=env, timeout=240)
        finally:
            victim.restore()
        intervention.join(timeout=5)
        out = result.stdout
        assert result.returncode == 0, out[-6000:]
        assert "cut" in seen and "restored" in seen, out[-6000:]
        # The two survivors noticed the lost host within 5 s of the cut, in the middle of their collectives.
        raised = [datetime.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f") for t in FAILED_COLLECTIVE.findall(out)]
        after_cut = [t for t in raised if t >= seen["cut"]]
        assert len(after_cut) >= 2, out[-6000:]
        assert max((t - seen["cut"]).total_seconds() for t in after_cut[:2]) <= 5.0, (seen, after_cut)
        assert f"blacklist failing host: {victim.address}" in out
        sizes = [start["size"] for start in events(out, "START")]
        shrunk = sizes.index("2")
        assert "3" in sizes[shrunk:], f"the host never rejoined after its cooldown: {sizes}\n{out[-6000:]}"
        dones = events(out, "DONE")
        assert sorted(d["rank"] for d in dones) == [0, 1, 2] and {d["size"] for d in dones} == {"3"}, out[-6000:]
        assert_same_model_after_every_reset(out)
        assert cluster.python_pids() == [], "no worker may outlive the job on any host"
