"""Recorded LSF job environments for the LSF and jsrun unit tests (LSF itself cannot run here).

``SUMMIT`` is a Summit-class job (``bsub -nnodes 2``): IBM CSM, jsrun, a launch node (``batch3``) listed first
with one slot, two compute nodes with 42 slots each; CSM's queries answer as recorded in ``CSM_*``. ``PLAIN``
is a plain LSF cluster (``bsub -n 16 -R "span[ptile=8]"``): no CSM, no jsrun, the job script runs on the first
execution host. :func:`install` puts one of them into a test's environment, with fake CSM tools, a fake
``ssh`` answering ``lscpu`` and (optionally) a fake ``jsrun`` on ``PATH``.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Dict

SUMMIT: Dict[str, str] = {
    "LSB_JOBID": "1234567",
    "LSB_JOBNAME": "hvd-resnet",
    "LSB_QUEUE": "batch",
    "LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42",
    "LSB_HOSTS": "batch3 " + "a01n01 " * 42 + "a01n02 " * 42,
    "LSB_MAX_NUM_PROCESSORS": "85",
    "LSB_SUB_HOST": "login1",
    "LSB_EXEC_CLUSTER": "summit",
    "LSF_BINDIR": "/opt/ibm/spectrumcomputing/lsf/10.1.0.9/linux3.10-glibc2.17-ppc64le-csm/bin",
    "CSM_ALLOCATION_ID": "3791001",
    "OMPI_MCA_ess_base_jobid": "0",
}

PLAIN: Dict[str, str] = {
    "LSB_JOBID": "4242",
    "LSB_JOBNAME": "train",
    "LSB_QUEUE": "normal",
    "LSB_MCPU_HOSTS": "node017 8 node018 8",
    "LSB_HOSTS": " ".join(["node017"] * 8 + ["node018"] * 8),
    "LSB_MAX_NUM_PROCESSORS": "16",
    "LSB_SUB_HOST": "login01",
    "LSF_BINDIR": "/usr/share/lsf/10.1/linux3.10-glibc2.17-x86_64/bin",
}

CSM_ALLOCATION = """\
allocation_id: 3791001
primary_job_id: 1234567
secondary_job_id: 0
num_nodes: 2
compute_nodes:
  - a01n02
  - a01n01
"""

CSM_NODE = """\
Total_Records: 1
Record_1:
  node_name: a01n01
  discovered_cores: 44
  discovered_sockets: 2
  discovered_gpus: 6
  discovered_hcas: 2
  physical_frame_location: a01
"""

LSCPU = "Architecture:        ppc64le\nCPU(s):              176\nThread(s) per core:  4\nCore(s) per socket:  22\n"

# A stand-in for jsrun: records its argv, environment and rankfile, then runs the command once per rank of the
# --erf_input file, one after another, with jsrun's task variables; exits with the highest status.
FAKE_JSRUN = """\
import json, os, re, subprocess, sys
argv = sys.argv[1:]
i = argv.index("--erf_input")
rankfile = open(argv[i + 1]).read()
with open(os.environ["FAKE_JSRUN_RECORD"], "w") as f:
    json.dump({"argv": argv, "env": dict(os.environ), "rankfile": rankfile}, f)
ranks = [l for l in rankfile.splitlines() if l.startswith("rank:")]
opts = {"--erf_input": 1, "--stdio_stderr": 1, "--stdio_stdout": 1, "--smpiargs": 1}
j = 0
while argv[j] in opts:
    j += 1 + opts[argv[j]]
status = 0
for line in ranks:
    rank = re.match(r"rank: (\\d+):", line).group(1)
    env = dict(os.environ, JSM_NAMESPACE_RANK=rank, JSM_NAMESPACE_SIZE=str(len(ranks)),
               OMPI_COMM_WORLD_RANK=rank, OMPI_COMM_WORLD_SIZE=str(len(ranks)))
    status = max(status, subprocess.call(argv[j:], env=env))
sys.exit(status)
"""


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def install(monkeypatch, tmp_path: Path, recorded: Dict[str, str], jsrun: bool = False) -> Path:
    """Make this test run inside the recorded LSF job: its variables, the CSM tools (for a CSM job), a fake
    ``ssh`` answering ``lscpu``, and a fake ``jsrun`` when ``jsrun``. Returns the fake tools' directory."""
    from horovod.runner.util import lsf

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in [k for k in os.environ if k.startswith(("LSB_", "LSF_", "CSM_"))]:
        monkeypatch.delenv(name)
    for key, value in recorded.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(lsf.LSFUtils, "_csm_info", {})
    if "CSM_ALLOCATION_ID" in recorded:
        (tmp_path / "allocation.yaml").write_text(CSM_ALLOCATION)
        (tmp_path / "node.yaml").write_text(CSM_NODE)
        _script(bin_dir / "csm_allocation_query", f"#!/bin/sh\ncat {tmp_path / 'allocation.yaml'}\n")
        _script(bin_dir / "csm_node_attributes_query", f"#!/bin/sh\ncat {tmp_path / 'node.yaml'}\n")
        monkeypatch.setattr(lsf, "CSM_ALLOCATION_QUERY", str(bin_dir / "csm_allocation_query"))
        monkeypatch.setattr(lsf, "CSM_NODE_QUERY", str(bin_dir / "csm_node_attributes_query"))
    _script(bin_dir / "ssh", "#!/bin/sh\necho \"$@\" > " + str(tmp_path / "ssh.args") + "\nprintf '"
            + LSCPU.replace("\n", "\\n") + "'\n")
    if jsrun:
        _script(bin_dir / "jsrun", f"#!{sys.executable}\n" + FAKE_JSRUN)
        monkeypatch.setenv("FAKE_JSRUN_RECORD", str(tmp_path / "jsrun.json"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir
