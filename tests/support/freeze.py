"""The freeze worker (tests/integration/workers/freeze.py), shared by the tests that stop a rank inside a
collective: its path, and the largest tensor it may stream in the shm plane for the others to wait in the data
plane.

From ``DIRECT_ALLREDUCE_BYTES`` the shm plane's allreduce of one tensor is direct: two waits (the addresses, then
the end), and a rank stopped in the last one has already let the others finish, so they would wait for it in the
next negotiation instead. Below it the collective runs in chunks, each with its own waits, hundreds of them with
small chunks."""
from horovod.backends.shm import DIRECT_ALLREDUCE_BYTES
from tests.support.launch import ROOT

WORKER = str(ROOT / "tests" / "integration" / "workers" / "freeze.py")
CHUNKED_MIB = (DIRECT_ALLREDUCE_BYTES >> 20) - 1
assert CHUNKED_MIB >= 1, "the direct allreduce's threshold fell below 2 MiB: give the freeze tests a smaller tensor"
