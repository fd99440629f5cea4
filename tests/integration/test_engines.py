"""podman, containerd (ctr) and dockerd drive `sandbox` directly as their OCI runtime, with
GPUs native: no hook is installed, no wrapper runs. Each engine runs privately under a temp
dir (tests/integration/engines.py); afterwards nothing of it is left mounted or running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import fixtures
import pytest
from engines import ENGINES

from tests.integration.helpers import mount_table
from tests.integration.test_hook import check_gpu_output

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

GPU_SCRIPT = "ls -l /dev/nvidia*; cudacheck; nvidia-smi; echo nvidia-smi=$?; grep Seccomp: /proc/self/status"


def _our_processes() -> set[int]:
    """Live (not zombie) gofers and engine processes on the host."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if stat.split(") ")[1][0] != "Z" and (b"sandbox" in cmd or b"containerd" in cmd or b"dockerd" in cmd
                                               or b"conmon" in cmd):
            pids.add(int(name))
    return pids


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request, tmp_path_factory, driver_root):
    name = request.param
    if shutil.which({"podman": "podman", "containerd": "containerd", "docker": "dockerd"}[name]) is None:
        pytest.skip(f"{name} is not installed (scripts/setup installs it)")
    before = (mount_table(), _our_processes())
    eng = ENGINES[name](tmp_path_factory.mktemp(name), driver_root)
    eng.start(fixtures.image_archive())
    yield eng
    eng.stop()
    assert mount_table() == before[0], f"{name} left mounts behind"
    assert _our_processes() <= before[1], f"{name} left processes behind"


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, (r.args, r.stdout, r.stderr)
    return r.stdout


def test_gpu_container(engine):
    """GPUs under the engine's own default seccomp profile, which sandbox enforces."""
    out = _ok(subprocess.run(engine.run("gpu1", "sh", "-c", GPU_SCRIPT, gpu=True), capture_output=True,
                             text=True, timeout=120))
    check_gpu_output(out)
    assert "Seccomp:\t2" in out, out


def test_gpu_container_under_the_default_profile_and_a_memory_limit(engine):
    """The engine's default seccomp profile and a 64 MiB limit: the GPU checks still pass,
    the limit reads back from the container's own cgroup, and `unshare -m` is refused."""
    script = (f"{GPU_SCRIPT}; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || "
              "cat /sys/fs/cgroup/memory.max; unshare -m true 2>&1 || echo unshare-refused")
    out = _ok(subprocess.run(engine.run("gpumem", "sh", "-c", script, gpu=True, memory=64 << 20),
                             capture_output=True, text=True, timeout=120))
    check_gpu_output(out)
    assert "Seccomp:\t2" in out and str(64 << 20) in out.split(), out
    assert "Operation not permitted" in out and "unshare-refused" in out, out


def test_the_wrapper_hands_what_asks_for_no_gpu_to_runc(engine):
    """scripts/sandbox-runc as the engine's runtime: the GPU container is sandbox's (its state
    under <root>.sandbox, the GPU checks pass), the plain one runc's (under <root>), and the
    engine drives both through exec and removal."""
    def states(sandbox: bool) -> list[str]:
        """The containers with a state under the root the engine gives the wrapper (wherever
        that is: containerd adds its namespace): sandbox's under <root>.sandbox, runc's under
        <root>. (The sandbox runtime's own root is another test's.)"""
        found = []
        for top, dirs, files in os.walk(engine.base):  # not rglob: the engine removes snapshots meanwhile
            dirs[:] = [d for d in dirs if "snapshot" not in d]
            path = Path(top)
            if "state.json" in files and not path.is_relative_to(engine.runtime_root) \
                    and (".sandbox/" in f"{path}/") == sandbox:
                found.append(path.name)
        return sorted(found)

    for name, gpu in (("wgpu", True), ("wplain", False)):
        _ok(subprocess.run(engine.run(name, "sleep", "100", gpu=gpu, detach=True, rm=False, runtime="wrapper"),
                           capture_output=True, text=True, timeout=120))
    try:
        sandboxed, runced = states(True), states(False)
        assert len(sandboxed) == 1 and len(runced) == 1 and sandboxed != runced, (sandboxed, runced)
        out = _ok(subprocess.run(engine.exec("wgpu", "sh", "-c", "cudacheck; ls /dev/nvidiactl", runtime="wrapper"),
                                 capture_output=True, text=True, timeout=60))
        assert "cuInit found" in out and "/dev/nvidiactl" in out, out
        out = subprocess.run(engine.exec("wplain", "sh", "-c", "ls /dev/nvidiactl 2>&1; echo ran", runtime="wrapper"),
                             capture_output=True, text=True, timeout=60)
        assert "ran" in out.stdout and "No such file" in out.stdout, (out.stdout, out.stderr)
    finally:
        engine.remove("wgpu", runtime="wrapper")
        engine.remove("wplain", runtime="wrapper")
    if engine.name != "podman":  # podman forgets runtime flags: its cleanup deletes without our --root
        assert states(True) == [] and states(False) == []


def test_no_gpu_container_has_no_driver(engine):
    out = _ok(subprocess.run(engine.run("plain1", "sh", "-c", "ls /dev/nvidia* 2>&1; cudacheck; echo rc=$?"),
                             capture_output=True, text=True, timeout=120))
    assert "/dev/nvidiactl" not in out and "rc=2" in out, out


def test_detached_then_exec_sees_the_gpus(engine):
    _ok(subprocess.run(engine.run("det1", "sleep", "100", gpu=True, detach=True, rm=False), capture_output=True,
                       text=True, timeout=120))
    try:
        out = _ok(subprocess.run(engine.exec("det1", "sh", "-c", "ls /dev/nvidia0 /dev/nvidiactl; cudacheck"),
                                 capture_output=True, text=True, timeout=60))
        assert "/dev/nvidia0" in out and "cuInit found" in out, out
        config = json.loads((engine.bundle_of("det1") / "config.json").read_text())
        hooks = [h["path"] for stage in (config.get("hooks") or {}).values() for h in stage]
        assert not [h for h in hooks if "sandbox" in h or "nvidia" in h], hooks  # GPUs native, no hook
    finally:
        engine.remove("det1")


def test_tty(engine):
    """-t: the runtime gets --console-socket, sends the pty master; the process sees a tty."""
    cmd = " ".join(f"'{a}'" for a in engine.run("tty1", "tty", tty=True))
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "/dev/pts/0" in r.stdout, (r.stdout, r.stderr)


def test_image_is_unchanged_after_gpu_runs(engine):
    """After the GPU containers, a fresh container of the same image has no driver files."""
    out = _ok(subprocess.run(engine.run("after1", "sh", "-c", "ls /usr/lib/x86_64-linux-gnu; cat /etc/ld.so.cache"
                                        " | grep -c nvidia; true"), capture_output=True, text=True, timeout=120))
    assert "libcuda" not in out and out.strip().endswith("0"), out
