"""`sandbox hook` under Debian's real runc and crun, as prestart and createRuntime hook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.integration.helpers import CLI, mount_table, sandbox, tree
from tests.integration.test_hostile import CASES, _break

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SCRIPT = "nvidia-smi; echo nvidia-smi=$?; cudacheck; ls -l /dev/nvidia*"


def runc(bundle, state_dir, name="c1"):
    return subprocess.run(["runc", "--root", str(state_dir), "run", "--bundle", str(bundle), name],
                          capture_output=True, text=True, timeout=60)


def crun(bundle, state_dir, name="c1"):
    """crun needs a pure cgroup2 view on this host: give it one in a private namespace."""
    script = ("mount -t cgroup2 none /sys/fs/cgroup && "
              f"exec crun --cgroup-manager=disabled --root {state_dir} run --bundle {bundle} {name}")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)


def install(bundle, driver_root, *extra):
    r = sandbox("hook", "install", bundle, "--driver-root", driver_root, *extra)
    assert r.returncode == 0, r.stderr


def check_gpu_output(out: str):
    assert "couldn't communicate with the NVIDIA driver" in out and "nvidia-smi=9" in out, out
    assert "error while loading shared libraries" not in out
    assert "libcuda.so.1: cuInit found" in out
    nodes = {p: (int(a), int(b)) for a, b, p in
             re.findall(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s+(\d+)\s.*\s(/dev/\S+)$", out, re.M)}
    assert nodes["/dev/nvidiactl"] == (195, 255) and nodes["/dev/nvidia0"] == (195, 0)
    assert nodes["/dev/nvidia1"] == (195, 1) and nodes["/dev/nvidia-uvm"][1] == 0


@pytest.mark.parametrize("runtime,stage", [("runc", "prestart"), ("runc", "createRuntime"),
                                           ("crun", "createRuntime"), ("crun", "prestart")])
def test_gpu_container_through_the_hook(runtime, stage, make_bundle, driver_root, tmp_path, rootfs_debian):
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
    install(bundle, driver_root, "--stage", stage, "--trace", tmp_path / "hook.json")
    before = (mount_table(), tree(rootfs_debian))
    r = (runc if runtime == "runc" else crun)(bundle, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert mount_table() == before[0] and tree(rootfs_debian) == before[1]
    shown = sandbox("trace", tmp_path / "hook.json")
    assert "mounts" in shown.stdout


def test_install_is_idempotent_and_keeps_other_hooks(make_bundle, driver_root):
    bundle = make_bundle(["true"])
    config = bundle / "config.json"
    spec = json.loads(config.read_text())
    spec["hooks"] = {"prestart": [{"path": "/bin/true"}]}
    config.write_text(json.dumps(spec))
    install(bundle, driver_root)
    install(bundle, driver_root, "--stage", "prestart")
    hooks = json.loads(config.read_text())["hooks"]
    assert "createRuntime" not in hooks
    assert [h["path"] for h in hooks["prestart"]] == ["/bin/true", hooks["prestart"][1]["path"]]
    ours = hooks["prestart"][1]["args"]
    # the launcher (scripts/setup builds it), the warm server's client, which runs our Python without one
    assert hooks["prestart"][1]["path"] == os.path.realpath(CLI[0]) and ours[:2] == ["sandbox", "hook"]


def test_an_older_installations_entry_is_replaced(make_bundle, driver_root):
    """An entry of an older installation (its C client in front of our Python's -c program)
    is ours too: install replaces it, and leaves one."""
    bundle = make_bundle(["true"])
    config = bundle / "config.json"
    spec = json.loads(config.read_text())
    code = "import sys; sys.path[:0] = ['/opt/x']; from sandbox.cli import run; run(sys.argv[1:])"
    spec["hooks"] = {"createRuntime": [{"path": "/opt/x/venv/bin/sandbox-hook",
                                        "args": ["sandbox-hook", "/opt/x/venv/bin/python", "-I", "-S", "-c", code, "hook"]}]}
    config.write_text(json.dumps(spec))
    install(bundle, driver_root)
    hooks = json.loads(config.read_text())["hooks"]["createRuntime"]
    assert len(hooks) == 1 and hooks[0]["args"][:2] == ["sandbox", "hook"], hooks


def test_no_gpu_bundle_touches_nothing(make_bundle, driver_root, tmp_path):
    bundle = make_bundle(["sh", "-c", "ls /dev /usr/lib/x86_64-linux-gnu"])
    install(bundle, "/nonexistent-driver-root")  # never looked at: the bundle asks for no GPU
    r = runc(bundle, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert "nvidia" not in r.stdout


def usr_bin_is_a_file(tmp_path, rootfs_debian):
    """A copy of the image whose /usr/bin is a file (a shell kept at /sh): the binaries of the
    plan cannot be mounted, after its devices and libraries were."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    shutil.copy2(rootfs_debian / "usr/bin/busybox", root / "sh")
    shutil.rmtree(root / "usr/bin")
    (root / "usr/bin").write_text("not a directory\n")
    (root / "bin").unlink()
    return root


def test_hook_error_refuses_the_container_and_leaves_nothing(make_bundle, driver_root, tmp_path, rootfs_debian):
    """/usr/bin is a file in this image: devices and libraries are mounted, then the binaries
    fail. runc must refuse to start, and every mount the hook made must be gone."""
    root = usr_bin_is_a_file(tmp_path, rootfs_debian)
    bundle = make_bundle(["/sh", "-c", "echo container ran"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    install(bundle, driver_root, "--trace", tmp_path / "hook.json")
    before = (mount_table(), tree(root))
    r = runc(bundle, tmp_path / "state")
    assert r.returncode != 0 and "container ran" not in r.stdout
    assert "/usr/bin" in r.stderr and "not a directory" in r.stderr, r.stderr
    assert "sandbox hook: /usr/bin" in r.stderr and "Traceback" not in r.stderr, r.stderr  # one line
    assert mount_table() == before[0] and tree(root) == before[1]


def test_hostile_env_has_no_effect(make_bundle, driver_root, tmp_path):
    """CVE-2025-23266: the image's LD_PRELOAD and PATH never reach the hook or anything."""
    marker = tmp_path / "preloaded"
    evil = tmp_path / "evil.c"
    evil.write_text('#include <stdio.h>\n__attribute__((constructor)) static void f(void) '
                    f'{{ FILE *m = fopen("{marker}", "a"); if (m) {{ fputs("loaded\\n", m); fclose(m); }} }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"), str(evil)], check=True)
    evil_bin = tmp_path / "bin"
    evil_bin.mkdir()
    for name in ("ldconfig", "ldconfig.real", "python3", "sh", "mount"):
        (evil_bin / name).write_text(f"#!/bin/sh\necho ran >> {marker}\n")
        (evil_bin / name).chmod(0o755)
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all", f"LD_PRELOAD={tmp_path}/evil.so",
                                                f"PATH={evil_bin}:/usr/bin:/bin"])
    install(bundle, driver_root)
    r = runc(bundle, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_rootfs_through_the_hook(case, tmp_path, rootfs_debian, driver_root, driver_version, make_bundle):
    host = tmp_path / "host"
    host.mkdir()
    (host / "host-secret").write_text("secret of the host\n")
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    shutil.copy2(rootfs_debian / "usr/bin/busybox", root / "sh")
    for path, target in CASES[case]:
        _break(root, path.format(version=driver_version), target.format(host=host))
    bundle = make_bundle(["/sh", "-c", "cat /usr/lib/x86_64-linux-gnu/host-secret; true"],
                         ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    install(bundle, driver_root)
    watched = (sorted(os.listdir("/")), sorted(os.listdir("/etc")), sorted(os.listdir("/dev")))
    before = (mount_table(), tree(host), os.stat("/etc/passwd").st_mtime_ns)
    r = runc(bundle, tmp_path / "state")
    assert mount_table() == before[0]
    assert tree(host) == before[1]
    assert os.stat("/etc/passwd").st_mtime_ns == before[2]
    assert (sorted(os.listdir("/")), sorted(os.listdir("/etc")), sorted(os.listdir("/dev"))) == watched
    assert "secret of the host" not in r.stdout


def test_runc_wrapper_for_containerd_and_docker(make_bundle, driver_root, tmp_path):
    """scripts/sandbox-runc, as containerd (BinaryName) or Docker (--runtime) would call it:
    `sandbox` itself runs the container, GPUs native, no hook written into config.json."""
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
    before = (bundle / "config.json").read_text()
    wrapper = os.path.join(os.path.dirname(__file__), "../../scripts/sandbox-runc")
    env = {**os.environ, "SANDBOX_DRIVER_ROOT": str(driver_root)}
    state = str(tmp_path / "state")
    # the created container's init keeps its stdio open until started: do not wait on pipes
    r = subprocess.run([wrapper, "--root", state, "create", "--bundle", str(bundle), "w1"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=env, timeout=60)
    assert r.returncode == 0
    assert (bundle / "config.json").read_text() == before
    subprocess.run([wrapper, "--root", state, "delete", "--force", "w1"], check=True, env=env)
    r = subprocess.run([wrapper, "--root", state, "run", "--bundle", str(bundle), "w2"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)


def test_hook_refuses_a_pid_in_its_own_mount_namespace(make_bundle, driver_root):
    """A state whose pid shares the hook's mount namespace (a wrong or stale pid) must not
    make it mount into the host's tree."""
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": os.getpid(), "bundle": str(bundle)})
    before = mount_table()
    r = sandbox("hook", "--driver-root", driver_root, input=state)
    assert r.returncode == 1 and "shares our mount namespace" in r.stderr
    assert mount_table() == before


def test_lib64_rootfs_through_the_hook(make_bundle, driver_root, tmp_path, rootfs_lib64):
    bundle = make_bundle(["sh", "-c", SCRIPT + "; ls /usr/lib64/libcuda.so.1"], ["NVIDIA_VISIBLE_DEVICES=all"],
                         rootfs=rootfs_lib64)
    install(bundle, driver_root)
    before = (mount_table(), tree(rootfs_lib64))
    r = runc(bundle, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert "/usr/lib64/libcuda.so.1" in r.stdout
    assert (mount_table(), tree(rootfs_lib64)) == before


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_hook_makes_no_redundant_mounts(runtime, make_bundle, driver_root, tmp_path):
    """The mounts the hook adds: one per file of the plan, the ld.so.cache bind, and one
    overlay per image directory that gains entries, parents first (a /usr/lib overlay made
    after the lib dir's used to hide it and clone its binds back: 36 mounts, not 22). The
    runtime's /dev tmpfs is written directly, not overlaid."""
    script = "cat /proc/self/mountinfo"
    plain = make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"])
    hooked = make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"])
    install(hooked, driver_root, "--stage", "createRuntime")
    run = runc if runtime == "runc" else crun
    points = []
    for bundle, name in ((plain, "m1"), (hooked, "m2")):
        r = run(bundle, tmp_path / "state", name)
        assert r.returncode == 0, r.stderr
        points.append([(line.split()[4], line.partition(" - ")[2].split()[0]) for line in r.stdout.splitlines()])
    added = [p for p in points[1] if p not in points[0]]
    assert len(points[1]) == len(set(points[1])), "a mount point mounted twice"
    plan = json.loads(sandbox("plan", hooked, "--driver-root", driver_root, "--json").stdout)
    files = [a["target"] for a in plan["actions"] if a["kind"] in ("library", "binary", "firmware", "device", "ipc",
                                                                  "config")]
    overlays = sorted(p for p, fstype in added if fstype == "overlay")
    # parents first: no overlay below another (/lib links to usr/lib: firmware and libraries
    # share /usr/lib's; the persistenced socket's /var is missing, so "/" takes it all here)
    assert overlays and not [(a, b) for a in overlays for b in overlays
                             if a != b and b.startswith(a.rstrip("/") + "/")], added
    assert len(added) == len(files) + 1 + len(overlays), added  # + the ld.so.cache bind


def _detached(bundle, tmp_path, name: str) -> tuple[list[str], int, str]:
    """runc running ``bundle`` detached as ``name``: (runc's command, the init's pid, the
    path of its v1 devices.list)."""
    runc = ["runc", "--root", str(tmp_path / "runc")]
    subprocess.run([*runc, "run", "-d", "-b", str(bundle), name], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    pid = json.loads(subprocess.run([*runc, "state", name], check=True, capture_output=True, text=True).stdout)["pid"]
    with open(f"/proc/{pid}/cgroup") as f:
        devices = next(line.split(":", 2)[2].strip() for line in f if ":devices:" in line)
    return runc, pid, f"/sys/fs/cgroup/devices{devices}/devices.list"


@pytest.mark.parametrize("end", ["undo", "release"])
def test_device_rules_added_for_the_gpu_nodes_are_put_back_or_kept(make_bundle, tmp_path, end):
    """What apply_plan does with the GPU nodes it allowed: undone when a mount fails afterwards
    (the hook's and the API's error path: the container's rules as they were, the new ones
    gone), kept once the setup is done. Either way no fd of the cgroup's stays open (a
    long-lived caller of sandbox.api sets up many containers)."""
    from gofer.cgroups import allow_devices

    runc, pid, rules = _detached(make_bundle(["sleep", "30"]), tmp_path, "undo1")
    try:
        with open(rules) as f:
            before = f.read()
        fds = sorted(os.listdir("/proc/self/fd"))
        grant = allow_devices(pid, [(195, 0), (195, 255)])
        with open(rules) as f:
            during = f.read()
        assert "c 195:0 rwm" in during and "c 195:255 rwm" in during and "c 195:0" not in before
        getattr(grant, end)()
        assert sorted(os.listdir("/proc/self/fd")) == fds
        with open(rules) as f:
            assert f.read() == (before if end == "undo" else during)
        # once done, never again: a later undo would write through fd numbers since reused
        with open(tmp_path / "reused", "w"):
            grant.undo()
            grant.release()
        assert (tmp_path / "reused").read_text() == ""
        with open(rules) as f:
            assert f.read() == (before if end == "undo" else during)
    finally:
        subprocess.run([*runc, "delete", "--force", "undo1"], timeout=60)


def test_a_rootfs_that_cannot_be_opened_takes_the_device_rules_back(make_bundle, tmp_path):
    """apply_plan fails after the GPU nodes were allowed and the container's namespace was
    joined (its rootfs is not there): the rules are as before, and no fd of the grant stays
    open in the caller (a forked child here: it joins the container's namespace)."""
    from gofer import syscalls as sc
    from mounts.actions import Device
    from sandbox.api import apply_plan

    runc, pid, rules = _detached(make_bundle(["sleep", "30"]), tmp_path, "noroot1")
    try:
        with open(rules) as f:
            before = f.read()
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                def open_fds() -> list[str]:
                    fd = os.open("self/fd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=sc.PROC)  # (the host's procfs)
                    try:
                        return sorted(set(os.listdir(fd)) - {str(fd)})
                    finally:
                        os.close(fd)

                fds = open_fds()
                try:
                    apply_plan([Device(source="/dev/null", target="/dev/nvidia0", major=195,
                                       minor=0)], "/no/such/rootfs", pid=pid)
                    out = "applied"
                except OSError as e:
                    out = f"{type(e).__name__} {open_fds() == fds or (fds, open_fds())}"
                os.write(w, out.encode())
            except BaseException as e:
                os.write(w, repr(e).encode())
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 200).decode()
        os.close(r)
        os.waitpid(child, 0)
        assert got == "FileNotFoundError True", got
        with open(rules) as f:
            assert f.read() == before
    finally:
        subprocess.run([*runc, "delete", "--force", "noroot1"], timeout=60)


@pytest.mark.parametrize("rule", [{"allow": True, "access": "rwm"},
                                  {"allow": True, "type": "c", "major": 195, "access": "rwm"}])
def test_device_rules_that_allow_the_gpu_nodes_already_are_left_alone(make_bundle, tmp_path, rule):
    """A privileged container (a *:* rwm) or a rule for every NVIDIA minor: nothing is added,
    so a failed hook's undo cannot deny the container what it had."""
    from gofer.cgroups import allow_devices

    bundle = make_bundle(["sleep", "30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"].setdefault("resources", {})["devices"] = [{"allow": False, "access": "rwm"}, rule]
    (bundle / "config.json").write_text(json.dumps(spec))
    runc, pid, rules = _detached(bundle, tmp_path, "keep1")
    try:
        with open(rules) as f:
            before = f.read()
        assert allow_devices(pid, [(195, 0), (195, 255)]) is None
        with open(rules) as f:
            assert f.read() == before
    finally:
        subprocess.run([*runc, "delete", "--force", "keep1"], timeout=60)


def test_two_hooks_of_one_container_at_once_mount_once(make_bundle, driver_root, tmp_path):
    """Two of our hooks for the same container, started together (and a third after them):
    one sets the container up, the others find it done; exactly one set of mounts."""
    bundle = make_bundle(["sh", "-c", SCRIPT + "; grep -c ' /dev/nvidia0 ' /proc/self/mountinfo; "
                          "grep -c ' /usr/lib/x86_64-linux-gnu/libcuda.so.1 \\| /etc/ld.so.cache ' "
                          "/proc/self/mountinfo || true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    install(bundle, driver_root, "--stage", "prestart")
    config = bundle / "config.json"
    spec = json.loads(config.read_text())
    hook = spec["hooks"]["prestart"][0]
    ours = [hook["path"], *hook["args"][1:]]
    both = ('cat > "$0"; "$@" < "$0" & p=$!; "$@" < "$0"; b=$?; wait $p; a=$?; "$@" < "$0"; c=$?; '
            'echo "hooks $a $b $c" >&2; [ "$a$b$c" = 000 ]')
    spec["hooks"]["prestart"] = [{"path": "/bin/sh", "args": ["sh", "-c", both, str(tmp_path / "state.json"),
                                                             *ours], "env": hook["env"]}]
    config.write_text(json.dumps(spec))
    r = runc(bundle, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    counts = r.stdout.strip().splitlines()[-2:]
    assert counts[0] == "1", r.stdout  # /dev/nvidia0 bound once
