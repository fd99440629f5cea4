"""The cgroup warm-up thread moves nothing: our cgroups are the same while it runs and after."""

import os
import time

import pytest

from sandbox.fork import warm_cgroup_lock


@pytest.mark.skipif(os.geteuid() != 0, reason="writes cgroup.procs")
def test_the_warm_up_changes_no_cgroup_and_stops():
    with open("/proc/self/cgroup") as f:
        before = f.read()
    flag = warm_cgroup_lock()
    time.sleep(0.03)
    with open("/proc/self/cgroup") as f:
        assert f.read() == before
    threads = len(os.listdir("/proc/self/task"))
    flag[0] = False
    deadline = time.monotonic() + 2
    while len(os.listdir("/proc/self/task")) >= threads and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(os.listdir("/proc/self/task")) < threads, "the thread did not stop"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a cgroup")
def test_a_thread_cannot_be_moved_out_of_its_process_cgroup():
    """What the warm-up relies on: its tid written to another cgroup's cgroup.threads (ours
    moved meanwhile, or a path that names another cgroup) is refused, and nothing moves."""
    import _thread

    base = next((p for p in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup") if os.path.exists(f"{p}/cgroup.threads")), None)
    if base is None:
        pytest.skip("no cgroup v2 hierarchy")
    other = f"{base}/sandbox-fork-test-{os.getpid()}"
    os.mkdir(other)
    try:
        with open("/proc/self/cgroup") as f:
            before = f.read()
        fd = os.open(f"{other}/cgroup.threads", os.O_WRONLY)
        try:
            with pytest.raises(OSError) as e:
                os.write(fd, str(_thread.get_native_id()).encode())
        finally:
            os.close(fd)
        assert e.value.errno in (95, 22)  # EOPNOTSUPP (EINVAL on older kernels)
        with open("/proc/self/cgroup") as f:
            assert f.read() == before
    finally:
        os.rmdir(other)
