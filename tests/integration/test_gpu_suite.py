"""Run tests/parallel/test_torch_cuda.py (horovod.torch on CUDA tensors) through the launcher, several ranks on the
machine's GPU(s): on the CUDA IPC plane with a 1 MiB window (every large collective in several chunks), at 2 and 3
ranks, and staged through host memory (HOROVOD_CUDA_IPC=0). Skipped, saying so, where torch sees no GPU (CI has
none); docs/gpu.md gives the command for a machine that has one."""
import pytest

from tests.support.launch import run_parallel_tests

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device: the GPU suite runs on a machine with one (docs/gpu.md)",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(400)
WINDOW = {"HOROVOD_CUDA_IPC_WINDOW_BYTES": str(1 << 20)}


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_cuda_on_the_ipc_plane(np_):
    run_parallel_tests(np_, "test_torch_cuda.py", env=WINDOW, timeout=360, pytest_args=["--timeout=120"])


def test_torch_cuda_staged_through_host_memory():
    run_parallel_tests(2, "test_torch_cuda.py", env={"HOROVOD_CUDA_IPC": "0"}, timeout=360,
                       pytest_args=["--timeout=120"])
