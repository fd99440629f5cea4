"""The two ways out of the container that runc does not have, each tried as an escape: the
test attempts it from inside and proves that it fails and that the host is untouched."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CLI, create, mount_table, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


FD = 57  # a number of its own: pytest's capture holds the low ones


def _run_with_fd(bundle, tmp_path, target, *extra) -> subprocess.CompletedProcess:
    """sandbox run with fd FD open on ``target`` in the caller, as `(exec 57</; sandbox run)`."""
    opened = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    os.dup2(opened, FD, inheritable=True)
    os.close(opened)
    try:
        return subprocess.run([*CLI, "run", str(bundle), "--root",
                               str(tmp_path / "state"), *map(str, extra)], pass_fds=(FD,),
                              capture_output=True, text=True, timeout=60)
    finally:
        os.close(FD)


@pytest.mark.parametrize("gpu", [False, True])
def test_callers_fds_do_not_reach_the_container(gpu, make_bundle, tmp_path, driver_root, rootfs_debian):
    """An fd open on a host directory: the container may neither list it nor use it."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host data\n")
    script = (f"ls /proc/self/fd; cat /proc/self/fd/{FD}/secret && echo READ-HOST; "
              f"echo pwned > /proc/self/fd/{FD}/planted && echo WROTE-HOST; true")
    bundle = make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])
    before = (mount_table(), tree(rootfs_debian))
    r = _run_with_fd(bundle, tmp_path, host, "--driver-root", driver_root)
    assert r.returncode == 0, r.stderr
    fds = r.stdout.split()
    assert fds[:3] == ["0", "1", "2"] and str(FD) not in fds, r.stdout
    assert "READ-HOST" not in r.stdout and "WROTE-HOST" not in r.stdout, r.stdout
    assert sorted(os.listdir(host)) == ["secret"]
    assert (mount_table(), tree(rootfs_debian)) == before


@pytest.mark.parametrize("gpu", [False, True])
def test_cwd_through_a_callers_fd_is_refused(gpu, make_bundle, tmp_path, driver_root):
    """process.cwd /proc/self/fd/57 (the image's WORKDIR) with the caller's fd 57 on a host
    directory: the CVE-2024-21626 way to the host's tree. Refused in one line; runc refuses
    it too. The same for `exec --cwd`."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host data\n")
    bundle = make_bundle(["sh", "-c", "cat secret; ls ../../../..; echo pwned > planted"],
                         ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["cwd"] = f"/proc/self/fd/{FD}"
    (bundle / "config.json").write_text(json.dumps(spec))
    r = _run_with_fd(bundle, tmp_path, host, "--driver-root", driver_root)
    assert r.returncode == 1 and "host data" not in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"sandbox run: process.cwd /proc/self/fd/{FD}: "), r.stderr
    assert sorted(os.listdir(host)) == ["secret"]


def test_no_capabilities_field_means_no_capabilities(make_bundle, tmp_path, rootfs_debian):
    """A spec without process.capabilities (optional in the OCI spec): runc grants none. With
    all of them the container could mknod a disk, remount the read-only root writable and
    write into the image, and unmount the /proc/kcore mask; here every one of those fails."""
    script = ("grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; "
              "mknod /dev/sda0 b 8 0 && echo MKNOD-OK; "
              "mount -o remount,rw / && echo REMOUNT-OK; touch /planted && echo WROTE-IMAGE; "
              "umount /proc/kcore && echo UNMASKED; true")
    bundle = make_bundle(["sh", "-c", script])
    spec = json.loads((bundle / "config.json").read_text())
    del spec["process"]["capabilities"]
    (bundle / "config.json").write_text(json.dumps(spec))
    before = (mount_table(), tree(rootfs_debian))
    r = subprocess.run([*CLI, "run", str(bundle), "--root", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    caps = dict(line.split(":") for line in r.stdout.splitlines() if line.startswith("Cap"))
    assert {k: v.strip() for k, v in caps.items()} == {k: "0000000000000000" for k in
                                                       ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    for marker in ("MKNOD-OK", "REMOUNT-OK", "WROTE-IMAGE", "UNMASKED"):
        assert marker not in r.stdout, r.stdout
    assert (mount_table(), tree(rootfs_debian)) == before
    assert not (rootfs_debian / "planted").exists()


def test_a_created_init_is_not_dumpable(make_bundle, tmp_path):
    """While the init waits on exec.fifo it is still the host's Python: a process of the
    container must not read its /proc/<pid>/exe (CVE-2019-5736: then overwrite it)."""
    bundle = make_bundle(["sleep", "30"])
    state = str(tmp_path / "state")
    with open(tmp_path / "out", "w") as out:
        r = subprocess.run([*CLI, "--root", state, "create", "--bundle",
                            str(bundle), "dump1"], stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 0, (tmp_path / "out").read_text()
    try:
        r = subprocess.run([*CLI, "--root", state, "exec", "dump1", "sh", "-c",
                            "head -c 4 /proc/1/exe | grep -c ELF; ls /proc/1/fd 2>&1 | head -3"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.splitlines()[0] == "0", (r.stdout, r.stderr)  # the interpreter stays out of reach
        assert "Permission denied" in r.stdout + r.stderr
    finally:
        subprocess.run([*CLI, "--root", state, "delete", "-f", "dump1"])


@pytest.mark.parametrize("caps", [["CAP_SYS_PTRACE", "CAP_KILL"], ["CAP_KILL"]])
def test_a_container_that_may_ptrace_sees_no_host_interpreter(caps, make_bundle, tmp_path):
    """With CAP_SYS_PTRACE a container can read the link /proc/<pid>/exe of our processes in
    its pid namespace despite their being non-dumpable (a created init, the child of exec),
    and rewrite the host's Python through it once it is no longer busy (CVE-2019-5736).
    Those run from a view of themselves the kernel will not write: the launcher's C init from
    a detached read-only mount of the launcher (the link reads "/", its root), Python from a
    sealed memfd; the link names no host file, and neither can be written. Without the
    capability the link stays unreadable."""
    bundle = make_bundle(["sleep", "30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "state"
    cli = [*CLI, "--root", str(root)]
    assert create(root, bundle, "pt1").returncode == 0
    try:
        # pid 1 waits for start: still ours. The exec'd shell looks at it.
        r = subprocess.run([*cli, "exec", "pt1", "sh", "-c", "readlink /proc/1/exe || echo unreadable; "
                            "echo x >> /proc/1/exe || echo not-written"], capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run([*cli, "delete", "--force", "pt1"], timeout=60)
    lines = r.stdout.split("\n")
    if "CAP_SYS_PTRACE" in caps:
        assert lines[0] in ("/", "/memfd:sandbox-python (deleted)") and "not-written" in r.stdout, (r.stdout, r.stderr)
    else:
        assert "unreadable" in r.stdout and "Permission denied" in r.stderr, (r.stdout, r.stderr)


GRAB = Path(__file__).parent / "programs" / "fdgrab.c"
LAUNCHER = Path(__file__).resolve().parents[2] / ".venv/bin/sandbox"


@pytest.fixture(params=["own", "served"])
def server_path(request, tmp_path):
    """SANDBOX_SERVER for the launcher: "" (its own planner) or a warm server's socket."""
    import engines

    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    if request.param == "own":
        yield ""
        return
    with engines.WarmServer(tmp_path) as warm:
        yield str(warm.path)


def _writable_memory(pid: int) -> bytes:
    """Every private writable mapping of ``pid`` (its heap, stack, the interpreter's arenas)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if perms.startswith("rw"):
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    out.append(mem.read(hi - lo))
                except OSError:
                    pass  # (a guard page, vvar)
    return b"".join(out)


def test_a_ptracer_in_the_container_takes_no_callers_fd_nor_its_environment(server_path, make_bundle, tmp_path):
    """The red team's probe (issue 29): a container process holding CAP_SYS_PTRACE calls
    pidfd_getfd on pid 1 (created, waiting for start) and on every new pid of its namespace
    (exec's child, caught between its fork into the namespace and its exec), while the caller
    of create and exec holds an fd on a host directory and a secret in its environment and its
    command line. runc's processes hold nothing of the caller's but stdio; neither may ours,
    served or not: no fd on the host's directory, no secret in a command line, an environment
    or a process's memory (bytes or an interpreter's UCS-4)."""
    host = tmp_path / "host"
    host.mkdir()
    w = tmp_path / "w"
    w.mkdir()
    subprocess.run(["gcc", "-static", "-O2", "-o", str(w / "fdgrab"), str(GRAB)], check=True)
    secret = f"engine-secret-{os.getpid()}-{time.monotonic_ns()}"
    bundle = make_bundle(["sleep", "30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_SYS_PTRACE"] for k in ("bounding", "effective", "permitted")}
    spec["mounts"].append({"destination": "/w", "type": "bind", "source": str(w), "options": ["rbind", "rw"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    root, cid = tmp_path / "state", f"grab{os.getpid()}"
    env = dict(os.environ, SANDBOX_SERVER=server_path, ENGINE_TOKEN=secret)

    def launch(*args, fd: bool = True) -> subprocess.CompletedProcess:
        opened = os.open(host, os.O_RDONLY | os.O_DIRECTORY)
        os.dup2(opened, FD, inheritable=True)
        os.close(opened)
        try:  # (into files: a created init holds the engine's stdout and stderr)
            with open(tmp_path / "launch.out", "w+") as out, open(tmp_path / "launch.err", "w+") as err:
                r = subprocess.run([str(LAUNCHER), "--root", str(root), *args], pass_fds=(FD,) if fd else (),
                                   stdout=out, stderr=err, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
                out.seek(0), err.seek(0)
                return subprocess.CompletedProcess(r.args, r.returncode, out.read(), err.read())
        finally:
            os.close(FD)

    try:
        r = launch("create", "-b", str(bundle), "--pid-file", tmp_path / f"pid-{secret}", cid)
        assert r.returncode == 0, r.stderr
        init = json.loads(launch("state", cid, fd=False).stdout)["pid"]
        r = launch("exec", "-d", cid, "/w/fdgrab", "/w/out", "/w/stop", "/w/ready", secret, fd=False)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while not (w / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (w / "ready").exists()
        for _ in range(3):
            r = launch("exec", "--pid-file", tmp_path / f"exec-{secret}", cid, "sh", "-c", "sleep 0.5")
            assert r.returncode == 0, r.stderr
        # --preserve-fds 3 with fds 4 and 5 closed: none of ours may land in that gap
        r = subprocess.run(["sh", "-c", f'exec 3</dev/null; exec "$0" --root {root} exec --preserve-fds 3 {cid} '
                            'sh -c "sleep 0.2; ls /proc/self/fd"', str(LAUNCHER)], capture_output=True, text=True,
                           timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and "3" in r.stdout.split(), (r.stdout, r.stderr)
        memory = _writable_memory(init)
        (w / "stop").touch()
        time.sleep(0.3)
    finally:
        launch("delete", "--force", cid, fd=False)
    st = host.stat()
    taken = [line.split() for line in (w / "out").read_text().splitlines()]
    assert {t[0] for t in taken} - {"1"}, "the probe caught no exec'd process: it proves nothing of exec's"
    assert [t for t in taken if t[2:4] == [str(st.st_dev), str(st.st_ino)] or secret in t] == [], taken
    # in the gap, nothing of ours: no socket (the server's connection), no file (a cgroup's);
    # directories of the container's own (its procfs, the cwd looked up) may be opened there
    assert [t for t in taken if t[0] != "1" and t[1] in ("4", "5") and t[4] != "d"] == [], taken
    assert secret.encode() not in memory, [memory[max(0, i - 64):i + 64] for i in
                                           range(len(memory)) if memory.startswith(secret.encode(), i)][:3]
