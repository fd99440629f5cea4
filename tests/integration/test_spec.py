"""The OCI spec fields `sandbox run` enforces, checked from inside the container."""

from __future__ import annotations

import json
import os
import subprocess

import fixtures
import pytest

from gofer import process
from tests.integration.helpers import create, mount_table, sandbox, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def run(bundle, tmp_path, *extra):
    return sandbox("run", bundle, "--root", tmp_path / "state", *extra)


def test_user_groups_capabilities_rlimits(make_bundle, tmp_path):
    spec = fixtures.default_spec(["true"])
    process = {**spec["process"],
               "user": {"uid": 1000, "gid": 1001, "additionalGids": [10, 20]},
               "args": ["sh", "-c", "id -u; id -g; id -G; grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; "
                                    "ulimit -n; echo $TERM"],
               "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 512, "soft": 256}],
               "capabilities": {k: ["CAP_NET_BIND_SERVICE", "CAP_KILL"]
                                for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}}
    r = run(make_bundle(process=process), tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0:2] == ["1000", "1001"] and set(lines[2].split()) == {"1001", "10", "20"}
    caps = dict(line.split(":\t") for line in lines[3:7])
    want = f"{(1 << 5) | (1 << 10):016x}"  # CAP_KILL=5, CAP_NET_BIND_SERVICE=10
    assert caps == {"CapPrm": want, "CapEff": want, "CapBnd": want, "CapAmb": want}
    assert lines[7] == "256" and lines[8] == "xterm"


def test_readonly_root_masks_and_hostname(make_bundle, tmp_path, driver_root):
    script = ("touch /newfile 2>/dev/null && echo root-writable || echo root-readonly; "
              "touch /usr/lib/x86_64-linux-gnu/x 2>/dev/null && echo libdir-writable || echo libdir-readonly; "
              "wc -c < /proc/keys; ls /proc/acpi | wc -l; "
              "echo 1 > /proc/sys/kernel/domainname 2>/dev/null && echo sys-writable || echo sys-readonly; "
              "hostname; touch /dev/shm/ok && echo shm-writable")
    r = run(make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"], hostname="gpubox"), tmp_path,
            "--driver-root", driver_root)
    assert r.stdout.split() == ["root-readonly", "libdir-readonly", "0", "0", "sys-readonly", "gpubox",
                                "shm-writable"], r.stdout + r.stderr


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu"])
def test_writable_root(gpu, make_bundle, tmp_path, rootfs_debian, driver_root):
    """root.readonly false: without GPUs the container writes into its rootfs, as under runc
    (OCI); a GPU container's root is a private overlay (as runsc's), so its writes vanish
    and the image is never modified."""
    import json
    import shutil

    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    env = ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else []
    bundle = make_bundle(["sh", "-c", "echo hi > /root/note; cat /root/note"], env, rootfs=root)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path, "--driver-root", driver_root)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    assert (root / "root/note").exists() is not gpu


def test_bind_mounts_and_join_a_namespace_by_path(make_bundle, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello").write_text("from the host\n")
    spec = fixtures.default_spec(["true"])
    mounts = spec["mounts"] + [{"destination": "/mnt/data", "type": "bind", "source": str(shared),
                                "options": ["rbind", "ro"]}]
    namespaces = [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                  {"type": "network", "path": f"/proc/{os.getpid()}/ns/net"}]
    bundle = make_bundle(["sh", "-c", "cat /mnt/data/hello; touch /mnt/data/x 2>/dev/null || echo ro; "
                                      "readlink /proc/self/ns/net"],
                         mounts=mounts, linux={**spec["linux"], "namespaces": namespaces})
    before = mount_table()
    r = run(bundle, tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[0] == "from the host" and out[1] == "ro"
    assert out[2] == os.readlink("/proc/self/ns/net")  # joined the test's network namespace
    assert not (shared / "x").exists() and mount_table() == before


@pytest.mark.parametrize("linux,message", [
    ({"intelRdt": {"closID": "x"}}, "linux.intelRdt: Intel RDT (resctrl) is not supported"),
    ({"uidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}]},
     "linux.uidMappings: mappings without a user namespace"),
    ({"namespaces": [{"type": "user"}, {"type": "mount"}]}, "linux.uidMappings: a new user namespace needs mappings"),
    ({"namespaces": [{"type": "user"}, {"type": "mount"}], "uidMappings": [{"containerID": 1, "hostID": 1000, "size": 1}],
      "gidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}]}, "the container's root (0) is not mapped"),
    ({"namespaces": [{"type": "user"}], "uidMappings": [{"containerID": 0, "hostID": 1000, "size": 0}]},
     "linux.uidMappings[0].size: 0 is out of range"),
])
def test_fields_we_cannot_enforce_are_refused(linux, message, make_bundle, tmp_path):
    """No field is parsed and then ignored: what cannot be enforced is one line, exit 2."""
    spec = fixtures.default_spec(["true"])
    bundle = make_bundle(linux={**spec["linux"], **linux}, hostname=None)  # (no uts namespace in some)
    r = run(bundle, tmp_path)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("tool", ["runc", "crun"])
def test_accepts_what_runc_and_crun_spec_write(tool, tmp_path, rootfs_debian):
    """`runc spec` / `crun spec` output, unchanged but for an absolute root.path (a rootfs
    reached through a symlink is refused, as runc refuses it): terminal true (no console
    socket: the caller's stdio is used) and args ["sh"], which exits at once on an empty stdin."""
    import json

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    subprocess.run([tool, "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["path"] = str(rootfs_debian)
    (bundle / "config.json").write_text(json.dumps(spec))
    r = sandbox("run", bundle, "--root", tmp_path / "state", stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert all("warning" in line for line in r.stderr.splitlines())


def test_symlinked_rootfs_is_refused_as_runc_refuses_it(make_bundle, tmp_path, rootfs_debian):

    bundle = make_bundle(["true"])
    (bundle / "rootfs").symlink_to(rootfs_debian)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["path"] = "rootfs"
    (bundle / "config.json").write_text(json.dumps(spec))
    r = sandbox("run", bundle, "--root", tmp_path / "state")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "reached through a symlink" in r.stderr, r.stderr
    theirs = subprocess.run(["runc", "--root", tmp_path / "runc", "run", "symlinked"], cwd=bundle,
                            capture_output=True, text=True)
    assert theirs.returncode != 0 and "symlink" in theirs.stderr, theirs.stderr


def test_gpu_scratch_is_capped(make_bundle, tmp_path, rootfs_debian, driver_root):
    """A writable GPU container's root writes land on our tmpfs: host memory, so capped by
    --scratch-size; past it the container sees ENOSPC, and the image stays unchanged."""
    import json

    from tests.integration.helpers import tree

    script = ("head -c 4194304 /dev/zero > /root/small && echo small-ok; "
              "head -c 33554432 /dev/zero > /root/big || echo big-refused; stat -c size=%s /root/big")
    bundle = make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(spec))
    before = tree(rootfs_debian)
    r = run(bundle, tmp_path, "--driver-root", driver_root, "--scratch-size", "16m")
    assert r.returncode == 0, r.stderr
    assert "small-ok" in r.stdout and "big-refused" in r.stdout, r
    assert int(r.stdout.split("size=")[1]) < 16 << 20
    assert tree(rootfs_debian) == before
    bad = run(bundle, tmp_path, "--driver-root", driver_root, "--scratch-size", "lots")
    assert bad.returncode == 2 and "--scratch-size" in bad.stderr


def test_sysctl_and_oom_score_adj_as_under_runc(make_bundle, tmp_path):
    import json

    bundle = make_bundle(["sh", "-c", "cat /proc/sys/net/ipv4/ip_forward /proc/self/oom_score_adj"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}
    spec["process"]["oomScoreAdj"] = 500
    (bundle / "config.json").write_text(json.dumps(spec))
    ours = run(bundle, tmp_path)
    theirs = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"sy{os.getpid()}"],
                            capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout == theirs.stdout == "1\n500\n"
    spec["linux"]["sysctl"] = {"kernel.panic": "1"}  # the host's: refused
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 2 and "kernel.panic" in r.stderr and "host" in r.stderr


def test_scheduler_io_priority_and_personality(make_bundle, tmp_path):
    """process.scheduler, process.ioPriority and linux.personality (runc 1.1 here ignores
    all three): the policy and nice value in /proc/self/stat, the I/O class read from the
    host with ioprio_get(2), the personality in uname -m; exec'd processes get the spec's
    scheduling too. A policy the cgroup forbids (real-time with no rt_runtime) is one line."""
    import ctypes

    bundle = make_bundle(["sh", "-c", "cut -d' ' -f19,41 /proc/self/stat; uname -m; sleep 30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5}
    spec["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_IDLE", "priority": 0}
    spec["linux"]["personality"] = {"domain": "LINUX32"}
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "state"
    assert create(root, bundle, "sched1").returncode == 0
    try:
        pid = json.loads(sandbox("--root", root, "state", "sched1").stdout)["pid"]
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(252, 1, pid) == 3 << 13  # ioprio_get(IOPRIO_WHO_PROCESS, pid): IDLE, 0
        out = sandbox("--root", root, "exec", "sched1", "sh", "-c", "cut -d' ' -f19,41 /proc/self/stat; uname -m")
        assert out.stdout.split() == ["5", "3", "i686"], (out.stdout, out.stderr)
    finally:
        sandbox("--root", root, "delete", "--force", "sched1")
    spec["process"]["scheduler"] = {"policy": "SCHED_FIFO", "priority": 10}
    spec["process"]["args"] = ["true"]
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 1 and r.stderr.strip().startswith("sandbox run: process.scheduler: sched_setattr"), r.stderr
    spec["process"]["scheduler"] = {"policy": "SCHED_FIFO", "flags": ["SCHED_FLAG_NOPE"]}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 2 and "process.scheduler.flags: unknown flag 'SCHED_FLAG_NOPE'" in r.stderr, r.stderr


def test_sched_deadline_is_set_last(make_bundle, tmp_path):
    """A task under SCHED_DEADLINE cannot fork: the policy is the last thing set, in the
    process that execs, for run and for exec (it broke exec's fork)."""
    bundle = make_bundle(["sleep", "30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["scheduler"] = {"policy": "SCHED_DEADLINE", "runtime": 10_000_000, "deadline": 100_000_000,
                                    "period": 100_000_000}
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "state"
    assert create(root, bundle, "dl1").returncode == 0
    try:
        r = sandbox("--root", root, "exec", "dl1", "cut", "-d", " ", "-f", "41", "/proc/self/stat")
        assert r.returncode == 0 and r.stdout.strip() == "6", (r.stdout, r.stderr)
    finally:
        sandbox("--root", root, "delete", "--force", "dl1")


def test_sched_deadline_and_start_container_hooks(make_bundle, tmp_path):
    """The startContainer hooks fork from the process that holds SCHED_DEADLINE by then: one
    line, unless the spec's flags let its children fork (the kernel resets them)."""
    bundle = make_bundle(["cut", "-d", " ", "-f", "41", "/proc/self/stat"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["scheduler"] = {"policy": "SCHED_DEADLINE", "runtime": 10_000_000, "deadline": 100_000_000,
                                    "period": 100_000_000}
    spec["hooks"] = {"startContainer": [{"path": "/bin/true"}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 2 and "process.scheduler: a SCHED_DEADLINE task cannot fork" in r.stderr, r.stderr
    spec["process"]["scheduler"]["flags"] = ["SCHED_FLAG_RESET_ON_FORK"]
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "6", (r.stdout, r.stderr)


def test_cwd_is_made_if_missing_and_entered_as_root_first(make_bundle, tmp_path, rootfs_debian):
    """As under runc: a missing process.cwd is made (in an overlay: the image stays as it is,
    where runc makes it in the image), and a cwd the user may not search (root's 0700 home)
    is entered as root first."""
    import shutil

    before = tree(rootfs_debian)
    bundle = make_bundle(["sh", "-c", "pwd"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["cwd"] = "/work/dir"
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 0 and r.stdout == "/work/dir\n", (r.stdout, r.stderr)
    assert tree(rootfs_debian) == before
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "root").chmod(0o700)
    bundle = make_bundle(["sh", "-c", "pwd; ls . 2>&1 | tail -1"], rootfs=root)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["cwd"], spec["process"]["user"] = "/root", {"uid": 1000, "gid": 1000}
    (bundle / "config.json").write_text(json.dumps(spec))
    ours = run(bundle, tmp_path)
    theirs = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"cwd{os.getpid()}"],
                            capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and ours.stdout.startswith("/root\n"), (ours.stdout, ours.stderr)
    assert ours.stdout == theirs.stdout, (ours.stdout, theirs.stdout, theirs.stderr)


@pytest.mark.parametrize("channels,expect", [("0", ["channel0"]), ("all", ["channel0", "channel1"])])
def test_imex_channels_in_the_container(channels, expect, make_bundle, tmp_path, driver_root):
    """NVIDIA_IMEX_CHANNELS: the channel nodes (the major of nvidia-caps-imex-channels in
    /proc/devices), bound in and allowed in the devices cgroup (ENXIO: no driver behind)."""
    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia-caps-imex-channels; "
                                      "stat -c '%t' /dev/nvidia-caps-imex-channels/channel0; "
                                      "head -c1 /dev/nvidia-caps-imex-channels/channel0 2>&1 | tail -1"],
                         ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_IMEX_CHANNELS={channels}"])
    r = run(bundle, tmp_path, "--driver-root", driver_root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:len(expect)] == expect and lines[len(expect)] == "1fb", r.stdout  # 507
    assert "No such device or address" in lines[-1], r.stdout


def test_an_unknown_imex_channel_is_one_line(make_bundle, tmp_path, driver_root):
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=7"])
    r = run(bundle, tmp_path, "--driver-root", driver_root)
    assert r.returncode == 2 and "NVIDIA_IMEX_CHANNELS: channel 7 not found" in r.stderr, r.stderr


@pytest.mark.parametrize("caps,expect", [
    ("compute,utility", ["/etc/OpenCL/vendors/nvidia.icd"]),
    ("graphics", ["/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
                  "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"]),
])
def test_the_loaders_files_per_capability(caps, expect, make_bundle, tmp_path, driver_root):
    """The ICD and vendor files of Debian's packages, where the loaders look, for the
    capabilities that use them; each names its library by SONAME, which the container's
    ld.so.cache resolves."""
    files = ["/etc/OpenCL/vendors/nvidia.icd", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
             "/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"]
    script = "; ".join(f"test -f {f} && echo {f}" for f in files) + \
        "; for so in libGLX_nvidia.so.0 libEGL_nvidia.so.0 libnvidia-opencl.so.1; do grep -c $so /etc/ld.so.cache; done"
    bundle = make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"])
    r = run(bundle, tmp_path, "--driver-root", driver_root)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.split()
    assert [x for x in lines if x.startswith("/")] == expect, r.stdout
    named = {"graphics": ("libGLX_nvidia.so.0", "libEGL_nvidia.so.0"), "compute,utility": ("libnvidia-opencl.so.1",)}
    counts = dict(zip(("libGLX_nvidia.so.0", "libEGL_nvidia.so.0", "libnvidia-opencl.so.1"),
                      [x for x in lines if not x.startswith("/")], strict=True))
    assert all(counts[so] != "0" for so in named[caps]), counts


@pytest.mark.skipif(process.apparmor() or process.selinux(),
                    reason="this kernel has AppArmor or SELinux: the labels would apply")
def test_labels_this_kernel_cannot_apply_are_refused(make_bundle, tmp_path):
    """A profile that silently does not apply is a container less confined than its author
    was told: one line, for run and for exec's flags, and features says so."""
    bundle = make_bundle(["sleep", "30"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["apparmorProfile"] = "docker-default"
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run(bundle, tmp_path)
    assert r.returncode == 2 and "process.apparmorProfile 'docker-default': AppArmor is not enabled" in r.stderr
    del spec["process"]["apparmorProfile"]
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "state"
    assert create(root, bundle, "lab1").returncode == 0
    try:
        for flag, field in (("--apparmor", "apparmorProfile"), ("--process-label", "selinuxLabel")):
            r = sandbox("--root", root, "exec", flag, "x", "lab1", "true")
            assert r.returncode != 0 and f"process.{field} 'x':" in r.stderr, (flag, r.stderr)
    finally:
        sandbox("--root", root, "delete", "--force", "lab1")
    features = json.loads(sandbox("features").stdout)["linux"]
    assert not features["apparmor"]["enabled"] and not features["selinux"]["enabled"]
