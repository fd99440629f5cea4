"""`sandbox run` end to end as root: real namespaces, real mounts, the real 535 driver files,
glibc's loader inside the container. Each test checks the host is left as it was."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.integration.helpers import (
    CLI,
    alive,
    children,
    mount_table,
    sandbox,
    sandbox_popen,
    tree,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SMI_NO_DRIVER = "couldn't communicate with the NVIDIA driver"
GPU_SCRIPT = ("nvidia-smi; echo nvidia-smi=$?; cudacheck; echo cudacheck=$?; "
              "ls -l /dev/nvidia*; for f in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; "
              "do [ -e $f ] && readlink $f; done; true")


@pytest.fixture
def host_unchanged(rootfs_debian, rootfs_lib64):
    """The host's mount table and both rootfs trees are the same after the test."""
    before = (mount_table(), tree(rootfs_debian), tree(rootfs_lib64))
    gofers = _gofers()
    yield
    _no_gofer_left(gofers)
    assert mount_table() == before[0], "the host's mount table changed"
    assert tree(rootfs_debian) == before[1], "the Debian rootfs changed"
    assert tree(rootfs_lib64) == before[2], "the lib64 rootfs changed"


def _gofers() -> set[str]:
    return {p for p in os.listdir("/proc") if p.isdigit() and alive(int(p)) and _comm(p) == "sandbox-gofer"}


def _no_gofer_left(before: set[str], timeout: float = 10) -> None:
    """A gofer whose supervisor was killed removes the container's cgroups, then exits: wait
    for that, so the next test's container of the same id finds none."""
    deadline = time.monotonic() + timeout
    while (left := _gofers() - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left, f"gofers left: {left}"


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def run(bundle, driver_root, tmp_path, *extra, **kw):
    return sandbox("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state", *extra, **kw)


@pytest.mark.parametrize("style", ["debian", "lib64"])
def test_gpu_container_runs_nvidia_smi(style, make_bundle, driver_root, driver_version, tmp_path,
                                       rootfs_debian, rootfs_lib64, host_unchanged):
    rootfs = rootfs_debian if style == "debian" else rootfs_lib64
    bundle = make_bundle(["sh", "-c", GPU_SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=rootfs)
    r = run(bundle, driver_root, tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    # glibc found libnvidia-ml.so.1 through our ld.so.cache: NVIDIA's own message, exit 9
    assert SMI_NO_DRIVER in out and "nvidia-smi=9" in out, out
    assert "error while loading shared libraries" not in out and "couldn't find libnvidia-ml" not in out
    assert "libcuda.so.1: cuInit found" in out and "cudacheck=0" in out
    nodes = {path: (int(major), int(minor)) for major, minor, path in
             re.findall(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s+(\d+)\s.*\s(/dev/\S+)$", out, re.M)}
    assert nodes == {"/dev/nvidiactl": (195, 255), "/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1),
                     "/dev/nvidia-uvm": (508, 0), "/dev/nvidia-uvm-tools": (508, 1)}
    assert f"libcuda.so.{driver_version}" in out


def test_one_gpu_and_no_gpu(make_bundle, driver_root, tmp_path, host_unchanged):
    one = run(make_bundle(["sh", "-c", "ls /dev"], ["NVIDIA_VISIBLE_DEVICES=1"]), driver_root, tmp_path)
    assert one.returncode == 0, one.stderr
    assert "nvidia1" in one.stdout.split() and "nvidia0" not in one.stdout.split()
    none = run(make_bundle(["sh", "-c", "ls /dev /usr/lib/x86_64-linux-gnu"]), driver_root, tmp_path)
    assert none.returncode == 0, none.stderr
    assert "nvidia" not in none.stdout


def test_exit_status_and_signal_propagate(make_bundle, driver_root, tmp_path, host_unchanged):
    assert run(make_bundle(["sh", "-c", "exit 7"]), driver_root, tmp_path).returncode == 7
    # without a pid namespace the shell is not pid 1 and can die by its own signal
    spec = fixtures_spec_without_pidns(make_bundle, ["sh", "-c", "kill -TERM $$"])
    assert run(spec, driver_root, tmp_path).returncode == 128 + signal.SIGTERM


def fixtures_spec_without_pidns(make_bundle, args, env=()):
    import fixtures

    spec = fixtures.default_spec(args, list(env))
    return make_bundle(args, env, linux={**spec["linux"], "namespaces": [
        {"type": t} for t in ("network", "ipc", "uts", "mount")]})


def test_signals_are_forwarded(make_bundle, driver_root, tmp_path, host_unchanged):
    bundle = fixtures_spec_without_pidns(make_bundle, ["sh", "-c", "echo started; exec sleep 30"])
    p = sandbox_popen("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")
    assert p.stdout.readline().strip() == "started"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 128 + signal.SIGTERM


def test_killing_the_supervisor_kills_gofer_and_container(make_bundle, driver_root, tmp_path, host_unchanged):
    bundle = make_bundle(["sh", "-c", "echo started; sleep 300"], ["NVIDIA_VISIBLE_DEVICES=all"])
    p = sandbox_popen("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")
    assert p.stdout.readline().strip() == "started"
    descendants, queue = [], [p.pid]
    while queue:
        pid = queue.pop()
        kids = children(pid)
        descendants += kids
        queue += kids
    assert descendants  # the container (Python's run: the gofer too; the launcher's: pid 1 is its child)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 5
    while any(alive(d) for d in descendants) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(d) for d in descendants)


def test_gofer_killed_mid_mount_leaves_nothing(make_bundle, driver_root, tmp_path, host_unchanged):
    """SIGKILL the gofer at different moments of its setup: nothing may remain."""
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all",
                                    "NVIDIA_DRIVER_CAPABILITIES=all"])
    for delay in (0.0, 0.01, 0.02, 0.03, 0.05, 0.08):
        p = sandbox_popen("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")
        time.sleep(delay)
        for pid in children(p.pid):
            os.kill(pid, signal.SIGKILL)
        code = p.wait(timeout=20)
        errors = [line for line in p.stderr.read().splitlines() if "warning" not in line]
        # killed before the container started: one line says so; after it started, the
        # container was killed with its parent and exits 137, as a container killed under
        # runc does; or the run finished first
        if code not in (0, 137):
            assert len(errors) == 1 and errors[0].startswith("sandbox run: "), errors
        else:  # the run was done, or the container died with it: nothing to say, nothing left
            assert not errors, (code, errors)
        assert not (tmp_path / "state").exists() or not os.listdir(tmp_path / "state"), os.listdir(tmp_path / "state")


def test_bad_bundle_exit_2(tmp_path, driver_root):
    (tmp_path / "config.json").write_text('{"ociVersion": "1.0", "root": {"path": "rootfs"}, "process": 5}')
    (tmp_path / "rootfs").mkdir()
    r = sandbox("run", tmp_path, "--driver-root", driver_root, "--root", tmp_path / "state")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "config.json" in r.stderr and "$.process" in r.stderr


def test_bad_gpu_request_exit_2(make_bundle, driver_root, tmp_path, host_unchanged):
    r = run(make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=9"]), driver_root, tmp_path)
    assert r.returncode == 2 and "unknown device '9'" in r.stderr


def test_exec_failure_is_127_with_a_message(make_bundle, driver_root, tmp_path, host_unchanged):
    r = run(make_bundle(["no-such-program"]), driver_root, tmp_path)
    assert r.returncode == 127 and "exec no-such-program" in r.stderr


def test_trace_has_both_processes_and_overlap(make_bundle, driver_root, tmp_path, host_unchanged):
    import json

    trace = tmp_path / "trace.json"
    r = run(make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"]), driver_root, tmp_path, "--trace", trace)
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    for name in ("bundle parse", "discovery", "closure + stream", "spec mounts",
                 "gpu mounts", "gpu libraries", "gpu ld.so.cache", "pivot_root", "exec"):
        assert name in spans, name
    assert "clone pid 1" in spans or "unshare" in spans, spans  # (the launcher's init, or Python's)
    assert len({e["pid"] for e in events if e["ph"] == "X"}) >= 2
    # the gofer is at work (imports, unshare, mounts) while the supervisor resolves the closure
    s = spans["closure + stream"]
    gofer = [e for e in events if e["ph"] == "X" and e["pid"] != s["pid"]]
    assert any(g["ts"] < s["ts"] + s["dur"] and s["ts"] < g["ts"] + g["dur"] for g in gofer)
    shown = sandbox("trace", trace, "--svg", tmp_path / "t.svg")
    assert shown.returncode == 0 and "critical path" in shown.stdout
    assert (tmp_path / "t.svg").read_text().startswith("<svg")


def test_same_bundle_runs_under_runc(make_bundle, tmp_path, host_unchanged):
    import subprocess

    bundle = make_bundle(["sh", "-c", "echo hello from runc; cat /etc/debian_version"])
    r = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "--bundle", str(bundle), "peer1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hello from runc" in r.stdout
    ours = sandbox("run", bundle, "--root", tmp_path / "state")
    assert ours.returncode == 0 and ours.stdout == r.stdout


def test_two_containers_at_once_and_id_in_use(make_bundle, driver_root, tmp_path, host_unchanged):
    a = sandbox_popen("run", make_bundle(["sh", "-c", "echo started; sleep 30"]), "--id", "one",
                      "--root", tmp_path / "state")
    assert a.stdout.readline().strip() == "started"
    quick = make_bundle(["true"])
    b = sandbox("run", quick, "--id", "two", "--root", tmp_path / "state")
    assert b.returncode == 0, b.stderr
    c = sandbox("run", quick, "--id", "one", "--root", tmp_path / "state")
    assert c.returncode == 1 and "'one' already exists" in c.stderr
    assert (tmp_path / "state/one/state.json").exists()  # the refused run left a's state alone
    a.kill()
    a.wait()


def test_state_records_the_running_container(make_bundle, tmp_path):
    import json

    p = sandbox_popen("run", make_bundle(["sh", "-c", "echo started; sleep 30"]), "--id", "st1",
                      "--root", tmp_path / "state")
    assert p.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = json.loads(sandbox("state", "st1", "--root", tmp_path / "state").stdout)
        if state["status"] == "running":
            break
        time.sleep(0.02)
    assert state["status"] == "running" and state["id"] == "st1"
    with open(f"/proc/{state['pid']}/status") as f:  # the container's pid 1, as the host sees it
        nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
    assert nspid == [str(state["pid"]), "1"]
    p.kill()
    p.wait()


@pytest.mark.parametrize("style", ["debian", "lib64"])
def test_container_ld_so_cache_is_the_image_s_plus_ours(style, make_bundle, driver_root, tmp_path,
                                                       rootfs_debian, rootfs_lib64):
    """The cache the container sees, read with glibc's own ldconfig -p: every entry of the
    image's cache, plus the driver's libraries at the container's paths."""
    import subprocess

    from tests.mounts.test_ldcache import ldconfig_p

    rootfs = rootfs_debian if style == "debian" else rootfs_lib64
    bundle = make_bundle(["cat", "/etc/ld.so.cache"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=rootfs)
    r = subprocess.run([*CLI, "run", str(bundle), "--driver-root", str(driver_root),
                        "--root", str(tmp_path / "state")], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (tmp_path / "cache").write_bytes(r.stdout)
    seen = ldconfig_p(tmp_path / "cache")
    image = ldconfig_p(rootfs / "etc/ld.so.cache")
    libdir = "/usr/lib/x86_64-linux-gnu" if style == "debian" else "/usr/lib64"
    assert set(image) <= set(seen)
    assert ("libcuda.so.1", True, f"{libdir}/libcuda.so.1") in seen
    assert ("libnvidia-ml.so.1", True, f"{libdir}/libnvidia-ml.so.1") in seen
    assert len(seen) == len(image) + 10  # 9 libraries (OpenCL's too) and libcuda.so


def test_gke_style_linux_devices(make_bundle, driver_root, tmp_path, host_unchanged):
    """linux.devices names /dev/nvidiactl and one GPU: those nodes, checked against the driver,
    and no libraries (they come as the bundle's own mounts)."""
    import fixtures

    spec = fixtures.default_spec(["true"])
    devices = [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 438},
               {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438}]
    bundle = make_bundle(["sh", "-c", "ls -l /dev/nvidia*; ls /usr/lib/x86_64-linux-gnu"],
                         linux={**spec["linux"], "devices": devices})
    r = run(bundle, driver_root, tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"195,\s+255 .* /dev/nvidiactl", r.stdout) and re.search(r"195,\s+1 .* /dev/nvidia1", r.stdout)
    assert "/dev/nvidia0" not in r.stdout and "libcuda" not in r.stdout


def test_state_root_error_is_one_line(make_bundle, tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    r = sandbox("run", make_bundle(["true"]), "--root", tmp_path / "file" / "state")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"sandbox run: --root {tmp_path}/file/state: not a directory"


def test_list_state_kill(make_bundle, tmp_path):
    """runc-like verbs over --root: the running container is listed, its state printed, and
    `kill` delivers the signal (the shell traps it and exits 7)."""
    import json

    state_root = tmp_path / "state"
    bundle = fixtures_spec_without_pidns(make_bundle, ["sh", "-c", "trap 'exit 7' TERM; echo started; "
                                                                   "while :; do sleep 0.05; done"])
    p = sandbox_popen("run", bundle, "--id", "k1", "--root", state_root)
    assert p.stdout.readline().strip() == "started"
    listed = sandbox("list", "--root", state_root)
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].split()[:1] == ["k1"]
    deadline = time.monotonic() + 5
    while (state := json.loads(sandbox("state", "k1", "--root", state_root).stdout))["status"] != "running":
        assert time.monotonic() < deadline, state  # "creating" until the supervisor has seen the exec
        time.sleep(0.05)
    assert state["id"] == "k1" and state["bundle"] == str(bundle)
    assert sandbox("kill", "k1", "TERM", "--root", state_root).returncode == 0
    assert p.wait(timeout=10) == 7
    gone = sandbox("state", "k1", "--root", state_root)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    assert sandbox("list", "--root", state_root).stdout.splitlines()[1:] == []


def test_rootfs_on_overlayfs_like_docker(make_bundle, driver_root, tmp_path, rootfs_debian, host_unchanged):
    """An image that is itself an overlay mount (Docker's overlay2 layout): our private
    overlay stacks on it. The overlay is mounted in a namespace of the test's own."""
    import subprocess

    for d in ("upper", "work", "merged"):
        (tmp_path / d).mkdir()
    merged = tmp_path / "merged"
    bundle = make_bundle(["cudacheck"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=merged)
    script = (f"mount -t overlay overlay -o lowerdir={rootfs_debian},upperdir={tmp_path}/upper,"
              f"workdir={tmp_path}/work {merged} && exec {CLI[0]} run {bundle} "
              f"--driver-root {driver_root} --root {tmp_path}/state")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "cuInit found" in r.stdout, r.stderr
    assert list((tmp_path / "upper").iterdir()) == []  # nothing written through to the image's layers


def test_bundle_without_process_is_refused_before_any_mount(tmp_path, rootfs_debian):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": str(rootfs_debian)}}))
    r = sandbox("run", tmp_path, "--root", tmp_path / "state")
    assert r.returncode == 2 and "process is missing" in r.stderr
