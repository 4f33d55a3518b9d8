"""``horovod.backends.spin``: waits poll only where every rank on the machine may have a core."""
import os

from horovod.backends import spin


def test_polls_only_while_the_machines_ranks_fit_its_cores(monkeypatch):
    monkeypatch.setattr(spin, "cores", lambda: 2)
    assert spin.poll_microseconds(100.0, 1) == 100.0
    assert spin.poll_microseconds(100.0, 2) == 100.0
    assert spin.poll_microseconds(100.0, 3) == 0.0
    assert spin.poll_microseconds(0.0, 1) == 0.0


def test_the_machine_is_the_kernel():
    """Every process on this kernel reports the same id, whatever its host name; without the boot id (not Linux)
    the host name stands in."""
    assert spin.machine_id() == spin.machine_id()
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        with open("/proc/sys/kernel/random/boot_id") as f:
            assert spin.machine_id() == f.read().strip()


def test_without_a_boot_id_the_host_name(monkeypatch):
    import socket

    monkeypatch.setattr(spin, "_BOOT_ID", "/nonexistent/boot_id")
    assert spin.machine_id() == socket.gethostname()
