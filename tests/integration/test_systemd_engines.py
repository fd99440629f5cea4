"""The engines with their systemd cgroup drivers, against a real systemd 252 (scripts/systemd-host:
PID 1 of private namespaces): podman (--cgroup-manager systemd), dockerd
(native.cgroupdriver=systemd), ctr (--runc-systemd-cgroup) and containerd's CRI (SystemdCgroup =
true for both handlers, pods in kubelet's slices) run GPU containers through `sandbox`, each
container a transient scope unit with its limits as properties, gone after removal; runc beside
it under the same driver, to compare.

Each test is one boot: this file, run as a program (``inside ENGINE BASE DRIVER_ROOT IMAGE``)
under scripts/systemd-host, starts the engine privately (scripts/engines.py, scripts/cri.py with
``systemd=True``), runs the checks, stops it and prints what it saw as one JSON line; an
AssertionError there is the test's failure. Afterwards the host has no mount or process more."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST = str(REPO / "scripts" / "systemd-host")
MiB = 1 << 20
GPU_SCRIPT = "ls -l /dev/nvidia*; cudacheck; nvidia-smi; echo nvidia-smi=$?; grep Seccomp: /proc/self/status"
RESULT = "systemd-engines-result: "

# --- inside systemd-host ---------------------------------------------------------------------


def _sh(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, (r.args, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def _show(unit: str, *props: str) -> dict[str, str]:
    out = _ok(_sh("systemctl", "show", unit, *(f"-p{p}" for p in props)))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _units(pattern: str) -> list[str]:
    out = _sh("systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", pattern).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()]


def _scope_of(pid: int) -> str:
    """The unit a process is in (its name=systemd or cgroup2 path's last part)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("name=systemd", ""):
            return path.rsplit("/", 1)[-1]
    raise AssertionError(Path(f"/proc/{pid}/cgroup").read_text())


def _memory_limit_file(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
    return Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "memory.max"


def _engine_checks(name: str, base: Path, driver_root: Path, image: Path) -> dict:
    sys.path.insert(0, str(REPO / "scripts"))
    from engines import ENGINES

    from tests.integration.test_hook import check_gpu_output

    seen: dict = {}
    eng = ENGINES[name](base, driver_root, systemd=True)
    eng.start(image)
    try:
        def scope(cname: str) -> str:
            if name == "containerd":
                return f"ctr-{cname}.scope"
            full = _ok(eng.cli("inspect", "--format", "{{.Id}}", cname)).strip()
            return f"{'libpod' if name == 'podman' else 'docker'}-{full}.scope"

        # a GPU container under the engine's own seccomp profile, and where it ran
        script = f"{GPU_SCRIPT}; echo cgroup=$(grep -m1 name=systemd /proc/self/cgroup)"
        out = _ok(subprocess.run(eng.run("sgpu", "sh", "-c", script, gpu=True), capture_output=True, text=True,
                                 timeout=120))
        check_gpu_output(out)
        assert "Seccomp:\t2" in out, out
        seen["gpu_cgroup"] = out.split("cgroup=")[-1].strip()
        # a plain container: no driver; with runc, the same
        for runtime in ("sandbox", "runc"):
            out = _ok(subprocess.run(eng.run(f"splain{runtime}", "sh", "-c",
                                             "ls /dev/nvidiactl 2>&1; echo cgroup=$(grep -m1 name=systemd /proc/self/cgroup)",
                                             runtime=runtime), capture_output=True, text=True, timeout=120))
            assert "No such file" in out, out
            seen[f"plain_cgroup_{runtime}"] = out.split("cgroup=")[-1].strip()
        # detached with a limit: a scope of its own with the limit as a property, the GPUs for exec,
        # an update (dockerd), and no unit left after removal
        for runtime in ("sandbox", "runc"):
            cname = f"sdet{runtime}"
            _ok(subprocess.run(eng.run(cname, "sleep", "100", gpu=runtime == "sandbox", detach=True, rm=False,
                                       runtime=runtime, memory=64 * MiB), capture_output=True, text=True, timeout=120))
            unit = scope(cname)
            try:
                props = _show(unit, "ActiveState", "MemoryLimit", "DevicePolicy", "Delegate")
                got = {"unit": unit, **props}
                if runtime == "sandbox":
                    got["exec"] = _ok(subprocess.run(eng.exec(cname, "sh", "-c", "ls /dev/nvidiactl; cudacheck"),
                                                     capture_output=True, text=True, timeout=60))
                if name == "docker":
                    _ok(eng.cli("update", "--memory", "96m", "--memory-swap", "200m", cname))
                    got["updated"] = _show(unit, "MemoryLimit")["MemoryLimit"]
                    pid = int(_ok(eng.cli("inspect", "--format", "{{.State.Pid}}", cname)).strip())
                    got["updated_file"] = _memory_limit_file(pid).read_text().strip()
            finally:
                eng.remove(cname, runtime=runtime)
            deadline = time.monotonic() + 10
            while _show(unit, "LoadState")["LoadState"] != "not-found" and time.monotonic() < deadline:
                time.sleep(0.1)
            got["after_remove"] = _show(unit, "LoadState")["LoadState"]
            seen[f"detached_{runtime}"] = got
    finally:
        eng.stop()
    seen["units_left"] = _units("libpod-*") + _units("docker-*") + _units("ctr-*")
    return seen


def _cri_checks(base: Path, driver_root: Path) -> dict:
    sys.path.insert(0, str(REPO / "scripts"))
    import cri as cri_mod

    seen: dict = {}
    cri = cri_mod.CRI(base, driver_root, systemd=True)
    try:
        cri.start()
        for handler in cri_mod.HANDLERS:
            got: dict = {}
            pod = cri.run_pod(f"sd-{handler}", handler)
            got["pod_slice"] = pod.cgroup
            pause = json.loads(cri.pod_status(pod, verbose=True).info["info"])["pid"]
            got["pause_unit"] = _scope_of(pause)
            got["pause_slice"] = _show(got["pause_unit"], "Slice")["Slice"]
            # a GPU container that exits 3
            cid = cri.run_container(pod, "exit3", ["sh", "-c", "ls /dev/nvidiactl; exit 3"],
                                    env={"NVIDIA_VISIBLE_DEVICES": "all"})
            st = cri.wait_exited(cid, timeout=20)
            got["exit3"] = (cri.api.ContainerState.Name(st.state), st.exit_code,
                            cri.container_log(pod, "exit3").split())
            # ExecSync and UpdateContainerResources in a running one
            cid2 = cri.run_container(pod, "sleeper", ["sleep", "1000"], memory=128 * MiB)
            pid = cri.container_info(cid2)["pid"]
            unit = _scope_of(pid)
            got["unit"] = unit
            got["limit_before"] = (_show(unit, "MemoryLimit")["MemoryLimit"], _memory_limit_file(pid).read_text().strip())
            r = cri.exec_sync(cid2, ["sh", "-c", "echo hi; exit 4"])
            got["exec_sync"] = (r.stdout.decode(), r.exit_code)
            cri.update_resources(cid2, memory=64 * MiB)
            got["limit_after"] = (_show(unit, "MemoryLimit")["MemoryLimit"], _memory_limit_file(pid).read_text().strip())
            # and all of it removed as kubelet does
            shims = cri_mod._processes_matching(b"-id\0" + pod.id.encode())
            cri.stop_container(cid2, timeout=2)
            cri.remove_container(cid2)
            cri.remove_container(cid)
            cri.stop_pod(pod)
            cri.remove_pod(pod)
            got["cgroups_systemd_left"] = cri.remove_pod_cgroup(pod)
            deadline = time.monotonic() + 10
            while any(cri_mod._alive(p) for p in (pid, pause, *shims)) and time.monotonic() < deadline:
                time.sleep(0.05)
            got["alive_after"] = [p for p in (pid, pause, *shims) if cri_mod._alive(p)]
            root = cri.runtime_root(handler)
            got["state_after"] = sorted(os.listdir(root)) if root.is_dir() else []
            got["mounts_after"] = [m for m in cri_mod.mounts_under(cri.base) if pod.id in m or cid2 in m]
            # (kubepods.slice and its QoS slice stay, as kubelet's do)
            got["units_after"] = _units("cri-containerd-*") + [u for u in _units(pod.cgroup)
                                                               if _show(u, "ActiveState")["ActiveState"] != "inactive"]
            got["cgroups_after"] = [str(d) for d in cri.pod_cgroup_dirs(pod) if d.exists()]
            seen[handler] = got
    except cri_mod.CRIError as e:
        raise AssertionError(f"{e}\n--- sandbox's failing calls:\n{cri.runtime_errors()[-3000:]}\n"
                             f"--- containerd:\n{cri.log_tail(30, grep='level=error')}") from None
    finally:
        seen["stop_problems"] = cri.stop()
    seen["cgroups_left"] = [str(d) for d in cri._cgroup_dirs() if d.exists()]
    seen["units_left"] = _units("cri-containerd-*") + _units("kubepods*")
    return seen


def _inside(argv: list[str]) -> int:
    name, base, driver_root = argv[0], Path(argv[1]), Path(argv[2])
    seen = (_cri_checks(base, driver_root) if name == "cri"
            else _engine_checks(name, base, driver_root, Path(argv[3])))
    print(RESULT + json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["inside"]:
    sys.path.insert(0, str(REPO))
    sys.exit(_inside(sys.argv[2:]))

# --- the tests -------------------------------------------------------------------------------

import fixtures  # noqa: E402
import pytest  # noqa: E402

from tests.integration.helpers import mount_table, processes_naming  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
              pytest.mark.skipif(not os.path.exists("/lib/systemd/systemd"), reason="needs systemd installed")]

BINARIES = {"podman": "podman", "docker": "dockerd", "containerd": "containerd", "cri": "containerd"}


def _new_mounts(before: list, base: Path) -> list:
    """Mounts there now and not before, where ours could be (the engines mount inside
    systemd-host's mount namespace: none should reach the host's)."""
    places = (str(base), str(REPO), "/sys/fs/cgroup", "/run", "/var/lib", "/dev")
    return [m for m in set(mount_table()) - set(before) if m[0].startswith(places)]


def _under_systemd(name: str, base: Path, driver_root: Path) -> dict:
    if shutil.which(BINARIES[name]) is None:
        pytest.skip(f"{BINARIES[name]} is not installed (scripts/setup installs it)")
    if name == "cri":
        pytest.importorskip("grpc", reason="grpcio is in the test extra (pyproject.toml)")
        pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra (pyproject.toml)")
        import cri as cri_mod

        cri_mod.stubs(), cri_mod.pause_image(), cri_mod.app_image()  # (built here, outside: cached)
    image = fixtures.image_archive()
    before = mount_table()
    r = subprocess.run([HOST, sys.executable, __file__, "inside", name, str(base), str(driver_root), str(image)],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    if r.returncode == 125:
        pytest.fail(f"systemd could not be booted: {r.stderr[-2000:]}")
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    assert "systemd-host: could not remove" not in r.stderr, r.stderr[-3000:]
    assert _new_mounts(before, base) == [], f"{name} left mounts behind"
    assert processes_naming(base) == [], f"{name} left processes behind"
    lines = [line for line in r.stdout.splitlines() if line.startswith(RESULT)]
    assert lines, r.stdout[-3000:]
    return json.loads(lines[-1][len(RESULT):])


def _check_detached(seen: dict, runtime: str, gpu: bool) -> None:
    d = seen[f"detached_{runtime}"]
    assert d["ActiveState"] == "active" and d["MemoryLimit"] == str(64 * MiB), d
    assert d["DevicePolicy"] in ("strict", "closed"), d
    assert d["after_remove"] == "not-found", d
    if gpu:
        assert "/dev/nvidiactl" in d["exec"] and "cuInit found" in d["exec"], d


@pytest.mark.parametrize("name", ["podman", "docker", "containerd"])
def test_engine_with_its_systemd_driver(name, tmp_path_factory, driver_root):
    """GPU container, plain container (sandbox and runc), detached with a limit (sandbox and
    runc): each a scope unit (podman's libpod-ID, Docker's docker-ID in system.slice, ctr's
    ctr-NAME), the limit its MemoryLimit, exec sees the GPUs, removal takes the unit."""
    seen = _under_systemd(name, tmp_path_factory.mktemp(name), driver_root)  # (podman: a short runroot)
    slice_ = "machine.slice" if name == "podman" else "system.slice"
    prefix = {"podman": "libpod-", "docker": "docker-", "containerd": "ctr-"}[name]
    for key in ("gpu_cgroup", "plain_cgroup_sandbox", "plain_cgroup_runc"):
        assert f"/{slice_}/{prefix}" in seen[key] and seen[key].endswith(".scope"), (key, seen)
    _check_detached(seen, "sandbox", gpu=True)
    _check_detached(seen, "runc", gpu=False)
    if name == "docker":
        for runtime in ("sandbox", "runc"):
            d = seen[f"detached_{runtime}"]
            assert d["updated"] == str(96 * MiB) and d["updated_file"] == str(96 * MiB), d
    assert seen["units_left"] == [], seen


def test_cri_with_systemd_cgroup(tmp_path_factory, driver_root):
    """containerd's CRI, SystemdCgroup = true, both handlers: the pod's pause and containers are
    cri-containerd-ID.scope units in the pod's kubelet slice; a GPU container that exits 3 is
    EXITED 3; ExecSync; UpdateContainerResources sets the unit's MemoryLimit and the cgroup's
    file; removal leaves no process, state, mount, unit or cgroup."""
    seen = _under_systemd("cri", tmp_path_factory.mktemp("cri"), driver_root)
    for handler in ("runc", "sandbox"):
        got = seen[handler]
        assert got["pod_slice"].startswith("kubepods-besteffort-pod") and got["pause_slice"] == got["pod_slice"], got
        assert got["pause_unit"].startswith("cri-containerd-") and got["unit"].startswith("cri-containerd-"), got
        state, code, log = got["exit3"]
        assert (state, code) == ("CONTAINER_EXITED", 3), got
        if handler == "sandbox":
            assert "/dev/nvidiactl" in log, got
        assert got["limit_before"] == [str(128 * MiB)] * 2, got
        assert got["exec_sync"] == ["hi\n", 4], got
        assert got["limit_after"] == [str(64 * MiB)] * 2, got
        assert got["alive_after"] == [] and got["state_after"] == [] and got["mounts_after"] == [], got
        assert got["units_after"] == [] and got["cgroups_after"] == [], got
        if handler == "sandbox":  # (runc's own cpuset, freezer, cpuacct dirs of the slice are kubelet's to remove)
            assert got["cgroups_systemd_left"] == [], got
    assert seen["stop_problems"] == [] and seen["cgroups_left"] == [], seen
    assert seen["units_left"] == [], seen
