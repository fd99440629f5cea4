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
    if flag is None:
        pytest.skip("no cgroup v2 hierarchy (the 0:: line) to write to")
    time.sleep(0.03)
    with open("/proc/self/cgroup") as f:
        assert f.read() == before
    threads = len(os.listdir("/proc/self/task"))
    flag[0] = False
    deadline = time.monotonic() + 2
    while len(os.listdir("/proc/self/task")) >= threads and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(os.listdir("/proc/self/task")) < threads, "the thread did not stop"
