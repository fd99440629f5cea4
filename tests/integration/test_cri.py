"""Pods through containerd's CRI, driven as kubelet drives them (scripts/cri.py): one private
containerd with its CRI plugin and two runtime handlers, ``runc`` and ``sandbox`` (containerd's
runc shim with BinaryName our runtime, on the fixture driver root), every test on both.

The pause image is /pause alone (registry.k8s.io/pause's shape); nothing is pulled. After the
module nothing of containerd is left mounted, running or in a cgroup.

CRI_PAUSE_DIRS=1 runs the module with a pause image that also has empty /proc, /dev and /sys
(a diagnostic: what happens past RunPodSandbox where the runtime needs mount points)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.helpers import mount_table

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

cri_mod = pytest.importorskip("cri", reason="scripts/cri.py (on sys.path through tests/conftest.py)")
pytest.importorskip("grpc", reason="grpcio is in the test extra (pyproject.toml)")
pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra (pyproject.toml)")

HANDLERS = list(cri_mod.HANDLERS)
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all"}
MiB = 1 << 20


def _alive(pid: int) -> bool:
    return cri_mod._alive(pid)


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2].split()[19]
    except OSError:
        return None


@pytest.fixture(scope="module")
def cri(tmp_path_factory, driver_root):
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("containerd is not installed (scripts/setup installs it)")
    before = mount_table()
    c = cri_mod.CRI(tmp_path_factory.mktemp("cri"), driver_root,
                    pause_with_mount_points=os.environ.get("CRI_PAUSE_DIRS") == "1")
    try:
        c.start()
        yield c
    finally:
        problems = c.stop()
        assert mount_table() == before, "containerd's CRI left mounts behind"
        assert not [d for d in c._cgroup_dirs() if d.exists()], "cgroups left behind"
        assert not problems, problems


class Failure:
    """What to show when a CRI call fails: the error, the sandbox runtime's failing calls
    since the test began (argv, the tail of log.json) and containerd's log lines of the ids."""

    def __init__(self, cri):
        self.cri = cri
        self.start = len(cri.runtime_errors())

    def __call__(self, error, *ids: str) -> None:
        pytest.fail(self.text(error, *ids), pytrace=False)

    def text(self, error, *ids: str) -> str:
        runtime = self.cri.runtime_errors()[self.start:][-3000:]
        lines = [line for i in ids if i for line in self.cri.log_tail(400, grep=i[:12]).splitlines()
                 if "level=error" in line or "level=warning" in line]
        text = f"{error}\n--- sandbox runtime's failing calls:\n{runtime or '(none)'}"
        text += "\n--- containerd's errors for " + ", ".join(i[:12] for i in ids if i) + ":\n"
        return text + ("\n".join(lines[-8:]) or "(none)")


@pytest.fixture
def fail(cri):
    return Failure(cri)


@pytest.fixture
def pods(cri, fail):
    """pods(name, handler, pid=...) -> a Pod, torn down as kubelet does at the end."""
    made = []

    def make(name: str, handler: str, pid: str = "CONTAINER"):
        err = None
        try:
            pod = cri.run_pod(name, handler, pid=pid)
        except cri_mod.CRIError as e:
            err = e
        if err is not None:
            fail(err, *_failed_sandbox_ids(cri))
        made.append(pod)
        return pod

    yield make
    for pod in made:
        if pod.id in cri.pods:
            cri.teardown_pod(pod)


def _failed_sandbox_ids(cri) -> list[str]:
    """The sandbox id in containerd's last RunPodSandbox error (it has no Pod)."""
    import re

    return re.findall(r"k8s\.io/([0-9a-f]{64})/", cri.log_tail(5, grep="RunPodSandbox"))[-1:]


def _run(cri, fail, pod, name: str, command: list[str], **kw) -> str:
    err = None
    try:
        return cri.run_container(pod, name, command, **kw)
    except cri_mod.CRIError as e:
        err = e
    fail(err, pod.id)
    raise AssertionError  # not reached


def _call(fail, step, *ids: str):
    err = None
    try:
        return step()
    except cri_mod.CRIError as e:
        err = e
    fail(err, *ids)


def _memory_cgroup(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise AssertionError(f"/proc/{pid}/cgroup names no memory cgroup (cgroup v1 hybrid expected)")


@pytest.mark.parametrize("handler", HANDLERS)
def test_pod_of_only_pause_is_ready(cri, pods, fail, handler):
    """RunPodSandbox of an image made of /pause alone: SANDBOX_READY, /pause running."""
    pod = pods("pause-only", handler)
    st = cri.pod_status(pod, verbose=True)
    assert st.status.state == cri.api.SANDBOX_READY, st
    import json

    pid = json.loads(st.info["info"])["pid"]
    deadline = time.monotonic() + 5  # `start` returns before the init has exec'd (runc's too)
    while _alive(pid) and os.readlink(f"/proc/{pid}/exe") != "/pause" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _alive(pid) and os.readlink(f"/proc/{pid}/exe") == "/pause", pid


@pytest.mark.parametrize("handler", HANDLERS)
def test_exit_code_is_recorded(cri, pods, fail, handler):
    """A GPU container (NVIDIA_VISIBLE_DEVICES=all) that exits 3: CONTAINER_EXITED, exitCode
    3; under sandbox its GPUs were there."""
    pod = pods("exit3", handler)
    cid = _run(cri, fail, pod, "exit3", ["sh", "-c", "ls /dev/nvidiactl; exit 3"], env=GPU_ENV)
    st = cri.wait_exited(cid, timeout=20)
    assert st.state == cri.api.CONTAINER_EXITED, (st, fail.text("", cid))
    assert st.exit_code == 3, (st, cri.container_log(pod, "exit3"), fail.text("", cid))
    if handler == "sandbox":
        assert "/dev/nvidiactl" in cri.container_log(pod, "exit3").split(), cri.container_log(pod, "exit3")


@pytest.mark.parametrize("handler", HANDLERS)
def test_oom_kill_is_recorded(cri, pods, fail, handler):
    """A 32 MiB limit and a shell that doubles a string until it is killed: OOMKilled, 137."""
    pod = pods("oom", handler)
    cid = _run(cri, fail, pod, "oom", ["sh", "-c", "x=a; while true; do x=$x$x; done"], memory=32 * MiB)
    st = cri.wait_exited(cid, timeout=30)
    assert st.state == cri.api.CONTAINER_EXITED, (st, fail.text("", cid))
    assert (st.reason, st.exit_code) == ("OOMKilled", 137), (st, fail.text("", cid))


@pytest.mark.parametrize("handler", HANDLERS)
def test_exec_sync(cri, pods, fail, handler):
    pod = pods("exec", handler)
    cid = _run(cri, fail, pod, "exec", ["sleep", "1000"])
    r = _call(fail, lambda: cri.exec_sync(cid, ["sh", "-c", "echo hi; exit 4"]), cid)
    assert (r.stdout, r.exit_code) == (b"hi\n", 4), (r, fail.text("", cid))


@pytest.mark.parametrize("handler", HANDLERS)
def test_update_container_resources(cri, pods, fail, handler):
    """UpdateContainerResources (kubelet's in-place resize): 128 MiB becomes 64 MiB in the
    container's own memory cgroup, then 256 MiB. containerd sets memory+swap to the limit
    where the kernel accounts swap: raised, v1's memsw must go first (runc's order)."""
    pod = pods("update", handler)
    cid = _run(cri, fail, pod, "update", ["sleep", "1000"], memory=128 * MiB)
    pid = cri.container_info(cid)["pid"]
    limit = _memory_cgroup(pid) / "memory.limit_in_bytes"
    memsw = limit.with_name("memory.memsw.limit_in_bytes")
    assert int(limit.read_text()) == 128 * MiB, limit
    _call(fail, lambda: cri.update_resources(cid, memory=64 * MiB), cid)
    assert int(limit.read_text()) == 64 * MiB, limit
    _call(fail, lambda: cri.update_resources(cid, memory=256 * MiB), cid)
    assert int(limit.read_text()) == 256 * MiB, limit
    if memsw.exists():
        assert int(memsw.read_text()) == 256 * MiB, memsw


@pytest.mark.parametrize("handler", HANDLERS)
def test_stop_in_a_shared_pid_namespace_leaves_no_process(cri, pods, fail, handler):
    """shareProcessNamespace: a container that leaves `sleep 1000 &` behind; after
    StopContainer none of its processes is left (the shim's kill --all)."""
    pod = pods("sharedpid", handler, pid="POD")
    cid = _run(cri, fail, pod, "sharedpid", ["sh", "-c", "sleep 1000 & sleep 1000"])
    cgroup = _memory_cgroup(cri.container_info(cid)["pid"])
    deadline = time.monotonic() + 10
    while True:
        procs = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        sleeps = {p: _start_time(p) for p in procs if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"}
        if len(sleeps) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(sleeps) >= 2, (procs, sleeps)
    _call(fail, lambda: cri.stop_container(cid, timeout=2), cid)
    deadline = time.monotonic() + 10
    left = sleeps
    while left and time.monotonic() < deadline:
        left = {p: t for p, t in sleeps.items() if _alive(p) and _start_time(p) == t}
        time.sleep(0.05)
    assert not left, (f"processes of the stopped container left: {sorted(left)}", fail.text("", cid))
    assert cri.status(cid).status.state == cri.api.CONTAINER_EXITED


@pytest.mark.parametrize("handler", HANDLERS)
def test_remove_leaves_nothing(cri, pods, fail, handler):
    """RemoveContainer, StopPodSandbox, RemovePodSandbox succeed; then no state of the
    runtime's, no mount, no cgroup and no process of the pod or its container is left."""
    pod = pods("remove", handler)
    cid = _run(cri, fail, pod, "remove", ["sleep", "1000"])
    import json

    init = cri.container_info(cid)["pid"]
    pause = json.loads(cri.pod_status(pod, verbose=True).info["info"])["pid"]
    shims = cri_mod._processes_matching(b"-id\0" + pod.id.encode())
    cgroups = [_memory_cgroup(init), _memory_cgroup(pause)]
    assert cri.runtime_root(handler).is_dir()
    steps = [("StopContainer", lambda: cri.stop_container(cid, timeout=2)),
             ("RemoveContainer", lambda: cri.remove_container(cid)),
             ("StopPodSandbox", lambda: cri.stop_pod(pod)),
             ("RemovePodSandbox", lambda: cri.remove_pod(pod))]
    for _name, step in steps:
        _call(fail, step, cid, pod.id)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in (init, pause, *shims)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in (init, pause, *shims) if _alive(p)] == [], (init, pause, shims)
    assert sorted(os.listdir(cri.runtime_root(handler))) == [], "the runtime's state is left"
    assert [m for m in cri_mod.mounts_under(cri.base) if pod.id in m or cid in m] == []
    assert [c for c in cgroups if c.exists()] == [], "the containers' cgroups are left"
    for d in cri.pod_cgroup_dirs(pod):
        assert not d.is_dir() or [p for p in d.rglob("*") if p.is_dir()] == [], f"{d} has cgroups left"
    cri.remove_pod_cgroup(pod)
    assert [d for d in cri.pod_cgroup_dirs(pod) if d.exists()] == []
