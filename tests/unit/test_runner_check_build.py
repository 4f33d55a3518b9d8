"""--check-build output format (upstream's table, with JAX added)."""
import pytest

from horovod.runner import build_info, launch

EXPECTED = """\
Horovod v1.2.3:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet
    [X] JAX

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo"""

INFO = build_info.BuildInfo(tensorflow=False, torch=True, mxnet=False, jax=True, mpi=True, gloo=True, nccl=False,
                            ddl=False, ccl=False)


def test_format():
    assert build_info.format_build("1.2.3", INFO) == EXPECTED
    assert build_info.format_build("1.2.3", INFO, verbose=True) == "\n" + EXPECTED


def test_check_build_flag_prints_and_exits_0(monkeypatch, capsys):
    monkeypatch.setattr(build_info, "detect", lambda: INFO)
    with pytest.raises(SystemExit) as exc:
        launch.parse_args(["-cb"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Horovod v{launch._version()}:\n") and "[X] PyTorch" in out


def test_probe_of_missing_module_is_false_and_fast():
    assert build_info._probe("no_such_module_xyz", "print(1)") is False
    assert build_info._probe("json", "import json; print(1)") is True
    assert build_info._probe("json", "raise SystemExit(3)") is False


def test_data_planes_say_mpi_only_when_available(monkeypatch):
    monkeypatch.delenv("HOROVOD_CPU_OPERATIONS", raising=False)
    monkeypatch.setenv("HOROVOD_MPI_REDUCE_MAX_BYTES", "4096")
    text = build_info.format_data_planes(INFO)
    assert "MPI, one host:              mpi+shm: MPI for reductions up to 4096 B" in text
    assert "HOROVOD_CPU_OPERATIONS unset" in text
    no_mpi = build_info.BuildInfo(**{**INFO.__dict__, "mpi": False})
    assert "MPI:                        not available (pip install horovod[mpi])" in build_info.format_data_planes(no_mpi)
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "tcp")
    assert "HOROVOD_CPU_OPERATIONS=tcp forces one" in build_info.format_data_planes(INFO)
