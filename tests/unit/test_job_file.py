"""The RiseML-style job file (``horovodrun --job``): parsing, every error with its line, process counts, the
mapping of workers onto hosts, ``-np`` and the ``--job`` flag."""
import logging
import textwrap
from pathlib import Path

import pytest

from horovod.runner import job_file, job_run, launch
from horovod.runner.job_file import JobFileError

ROOT = Path(__file__).resolve().parents[2]


def parse(text: str) -> job_file.JobFile:
    return job_file.parse(textwrap.dedent(text), "riseml.yml")


NESTED = """\
    project: digits
    train:
      framework: pytorch
      pytorch:
        version: "2.1"
        horovod:
          workers: 2
      resources:
        gpus: 0
        cpus: 2
        mem: 4096
      run:
        - python prepare.py
        - python train.py --epochs 3
    """


def test_nested_form_is_read_whole():
    job = parse(NESTED)
    assert (job.project, job.framework, job.framework_version) == ("digits", "pytorch", "2.1")
    assert (job.workers, job.processes, job.num_proc) == (2, 1, 2)
    assert (job.gpus, job.cpus, job.mem_mib) == (0, 2, 4096)
    assert [(line.index, line.text, line.yaml_line) for line in job.run] == [
        (1, "python prepare.py", 13), (2, "python train.py --epochs 3", 14)]


@pytest.mark.parametrize("text, workers, processes", [
    ("train:\n  framework: jax\n  horovod:\n    workers: 3\n  run: python t.py\n", 3, 1),            # flat form
    ("train:\n  keras:\n    horovod: {workers: {count: 2, processes: 4}}\n  run: [a]\n", 2, 4),
    ("train:\n  tensorflow:\n    horovod: {workers: 2}\n  resources: {gpus: 4}\n  run: [a]\n", 2, 4),  # per GPU
    ("train:\n  mxnet:\n    horovod: {workers: {count: 1, processes: 2}}\n  resources: {gpus: 8}\n"
     "  run: [a]\n", 1, 2),                                                                 # processes wins
])
def test_process_counts(text, workers, processes):
    job = parse(text)
    assert (job.workers, job.processes, job.num_proc) == (workers, processes, workers * processes)


@pytest.mark.parametrize("text, line, message", [
    ("train:\n  horovod: {workers: 2}\n  run: a\n  image: x\n", 4,
     "unknown key 'image' in train; allowed keys: framework, pytorch"),
    ("project: p\nnotebook: {}\ntrain: {}\n", 2, "unknown key 'notebook' in the job file"),
    ("train:\n  pytorch:\n    horovod:\n      workers: 2\n      worker: 3\n  run: a\n", 5,
     "unknown key 'worker' in horovod; allowed keys: workers"),
    ("train:\n  pytorch:\n    horovod: {workers: {count: 2, procs: 2}}\n  run: a\n", 3,
     "unknown key 'procs' in horovod.workers; allowed keys: count, processes"),
    ("train:\n  horovod: {workers: 1}\n  resources:\n    gpu: 1\n  run: a\n", 4,
     "unknown key 'gpu' in resources; allowed keys: gpus, cpus, mem"),
    ("train:\n  pytorch:\n    horovod: {workers: 1}\n    tensorboard: true\n  run: a\n", 4,
     "unknown key 'tensorboard' in train.pytorch"),
    ("train:\n  horovod:\n    workers: two\n  run: a\n", 3,
     "horovod.workers must be a whole number (at least 1), not 'two'"),
    ("train:\n  horovod:\n    workers: 0\n  run: a\n", 3, "horovod.workers must be at least 1, not 0"),
    ("train:\n  horovod: {workers: 2.5}\n  run: a\n", 2, "horovod.workers must be a whole number"),
    ("train:\n  horovod: {workers: {count: 2, processes: x}}\n  run: a\n", 2,
     "horovod.workers.processes must be a whole number (at least 1), not 'x'"),
    ("train:\n  horovod: {workers: {processes: 2}}\n  run: a\n", 2, "horovod.workers has no 'count'"),
    ("train:\n  horovod: {workers: 1}\n  resources: {gpus: -1}\n  run: a\n", 3, "resources.gpus must be at least 0"),
    ("train:\n  horovod: {workers: 1}\n  resources: {cpus: lots}\n  run: a\n", 3,
     "resources.cpus must be a number greater than 0, not 'lots'"),
    ("train:\n  horovod: {workers: 1}\n  resources: {mem: 4G}\n  run: a\n", 3,
     "resources.mem (MiB) must be a whole number"),
    ("train:\n  horovod: {workers: 1}\n  run:\n    - echo a\n    - [b]\n", 5,
     "train.run line 2 must be a non-empty string, not a list"),
    ("train:\n  horovod: {workers: 1}\n  run: []\n", 3, "train.run is an empty list"),
    ("train:\n  horovod: {workers: 1}\n", 1, "train has no 'run' lines"),
    ("train:\n  framework: pytorch\n  run: a\n", 1,
     "the job has no Horovod workers; add train.<framework>.horovod (or train.horovod)"),
    ("train:\n  framework: torch\n  horovod: {workers: 1}\n  run: a\n", 2,
     "unknown framework 'torch' in train.framework; use one of: pytorch, tensorflow"),
    ("train:\n  framework: keras\n  pytorch: {horovod: {workers: 1}}\n  run: a\n", 3,
     "train.framework is 'keras' but the framework section is 'pytorch'"),
    ("train:\n  pytorch: {horovod: {workers: 1}}\n  jax: {}\n  run: a\n", 3,
     "sections for two frameworks (pytorch and jax)"),
    ("train:\n  horovod: {workers: 1}\n  pytorch: {horovod: {workers: 1}}\n  run: a\n", 2,
     "train.horovod and train.pytorch.horovod both give the workers"),
    ("train:\n  horovod: {workers: 1}\n  run: a\n  run: b\n", 4, "duplicate key 'run' in train (first given on "
     "line 3)"),
    ("train: [a]\n", 1, "train must be a mapping of keys to values"),
    ("project: p\n", 1, "the job file has no 'train' section"),
    ("train:\n  run: [a\n", 3, "not valid YAML"),
])
def test_errors_name_the_line(text, line, message):
    with pytest.raises(JobFileError) as info:
        job_file.parse(text, "riseml.yml")
    assert str(info.value).startswith(f"riseml.yml, line {line}: "), str(info.value)
    assert message in str(info.value)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "riseml.yml"
    path.write_text("# nothing\n")
    with pytest.raises(JobFileError, match=f"{path}: the job file is empty"):
        job_file.load(str(path))


def test_workers_take_the_hosts_in_order_or_all_run_locally(tmp_path, caplog):
    job = parse("train:\n  horovod: {workers: {count: 2, processes: 3}}\n  run: a\n")
    assert job_run.worker_hosts(job) == ["localhost", "localhost"]
    assert job_run.hosts_string(job, job_run.worker_hosts(job)) == "localhost:6"
    with caplog.at_level(logging.WARNING, "horovod.runner"):
        hosts = job_run.worker_hosts(job, "h1:8,h2,h3")   # slots optional with --job
    assert hosts == ["h1", "h2"] and "h3 unused" in caplog.text
    assert job_run.hosts_string(job, hosts) == "h1:3,h2:3"   # -H slot counts are not used
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("b slots=1\na slots=1\n")
    assert job_run.worker_hosts(job, hostfile=str(hostfile)) == ["b", "a"]
    with pytest.raises(ValueError, match=r"riseml.yml asks for 2 workers but 1 host\(s\) were given \(h1\)"):
        job_run.worker_hosts(job, "h1:4")


def test_np_comes_from_the_file_and_must_agree():
    job = parse("train:\n  horovod: {workers: {count: 2, processes: 2}}\n  run: a\n")
    assert job_run.check_num_proc(job, None) == 4 == job_run.check_num_proc(job, 4)
    with pytest.raises(ValueError, match=r"-np 3 disagrees with riseml.yml, which runs 4 processes \(2 worker"):
        job_run.check_num_proc(job, 3)


def test_resources_beyond_this_machine_are_reported(caplog, monkeypatch):
    monkeypatch.setattr(job_run.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(job_run, "_total_memory_mib", lambda: 1000)
    job = parse("train:\n  horovod: {workers: 2}\n  resources: {cpus: 1.5, mem: 600}\n  run: a\n")
    with caplog.at_level(logging.WARNING, "horovod.runner"):
        job_run.check_resources(job, ["remote-host", "localhost"])
        assert caplog.text == ""                         # one local worker: 1.5 CPUs and 600 MiB fit
        job_run.check_resources(job, ["localhost", "localhost"])
    assert "ask for 1.5 CPUs each (resources.cpus) but it has 2" in caplog.text
    assert "ask for 600 MiB each (resources.mem) but it has 1000 MiB" in caplog.text


def test_job_flag_makes_np_optional_and_is_exclusive_with_a_command(tmp_path):
    args = launch.parse_args(["--job", "riseml.yml", "-H", "a,b"])
    assert (args.job, args.np, args.hosts) == ("riseml.yml", None, "a,b")
    with pytest.raises(SystemExit):
        launch.parse_args(["python", "train.py"])          # without --job, -np is still required
    path = tmp_path / "riseml.yml"
    path.write_text("train:\n  horovod: {workers: 1}\n  run: a\n")
    with pytest.raises(ValueError, match="--job runs the job file's 'run' lines: drop the command"):
        launch._run(launch.parse_args(["--job", str(path), "python", "train.py"]))
    with pytest.raises(ValueError, match="drop --mpi"):
        launch._run(launch.parse_args(["--job", str(path), "--mpi"]))


def test_the_example_job_file_is_valid():
    job = job_file.load(str(ROOT / "examples" / "riseml" / "riseml.yml"))
    assert (job.framework, job.workers, job.processes) == ("pytorch", 2, 1)
    for line in job.run:
        script = next(word for word in line.text.split() if word.endswith(".py"))
        assert (ROOT / script).is_file(), script
