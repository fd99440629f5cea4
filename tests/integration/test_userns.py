"""User namespaces with uid/gid mappings (runc's way: the user namespace owns the container's
other namespaces), with and without GPUs, for run, create/start and exec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CLI, create, mount_table, runc_run, sandbox, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

MAP = [{"containerID": 0, "hostID": 100000, "size": 65536}]
PROBE = "cat /proc/self/uid_map /proc/self/gid_map; id; stat -c '%U %G' /; grep CapEff /proc/self/status"


def _bundle(make_bundle, args, env=(), **linux):
    bundle = make_bundle(args, list(env))
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["namespaces"].append({"type": "user"})
    spec["linux"].update({"uidMappings": MAP, "gidMappings": MAP, **linux})
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def test_run_in_a_mapped_user_namespace_as_under_runc(make_bundle, tmp_path, rootfs_debian):
    """The maps, the ids, the capabilities and the rootfs's owner (the host's root's files:
    nobody in there) read the same as under runc."""
    bundle = _bundle(make_bundle, ["sh", "-c", PROBE])
    before = (mount_table(), tree(rootfs_debian))
    ours = sandbox("run", bundle, "--root", tmp_path / "s")
    theirs = runc_run(bundle, tmp_path / "runc", f"un{os.getpid()}")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    lines, runc_lines = ours.stdout.splitlines(), theirs.stdout.splitlines()
    assert lines[0].split() == lines[1].split() == ["0", "100000", "65536"]
    assert lines[3] == "nobody nogroup" and lines == runc_lines
    assert (mount_table(), tree(rootfs_debian)) == before


def test_gpu_container_in_a_user_namespace(make_bundle, tmp_path, driver_root, rootfs_debian):
    bundle = _bundle(make_bundle, ["sh", "-c", "cudacheck; nvidia-smi; echo nvidia-smi=$?; ls /dev/nvidia0; "
                                               "cat /proc/self/uid_map"], ["NVIDIA_VISIBLE_DEVICES=all"])
    before = (mount_table(), tree(rootfs_debian))
    r = sandbox("run", bundle, "--root", tmp_path / "s", "--driver-root", driver_root)
    assert r.returncode == 0, r.stderr
    assert "libcuda.so.1: cuInit found" in r.stdout and "nvidia-smi=9" in r.stdout, r.stdout
    assert "/dev/nvidia0" in r.stdout and r.stdout.splitlines()[-1].split() == ["0", "100000", "65536"]
    assert (mount_table(), tree(rootfs_debian)) == before


@pytest.mark.parametrize("image", ["directory", "overlayfs"])
def test_gpu_container_in_a_user_namespace_with_a_volume_the_image_lacks(image, make_bundle, tmp_path, driver_root,
                                                                         rootfs_debian):
    """A volume whose mount point the image lacks puts an overlay on "/"; the driver's files
    then go into image directories under it, nobody's in there: each gets an overlay of its
    own (root in the namespace may not add to them), over the image's directory itself (over
    ours, an overlayfs image, as containerd's and Docker's are, would stack too deep). They
    failed with EACCES, then with EINVAL on an overlayfs image."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "data").write_text("mine\n")
    bundle = _bundle(make_bundle, ["sh", "-c", "cat /data/data; ls /dev/nvidia0; cudacheck"],
                     ["NVIDIA_VISIBLE_DEVICES=all"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": str(volume), "options": ["rbind"]})
    command = [*CLI, "run", str(bundle), "--root", str(tmp_path / "s"), "--driver-root", str(driver_root)]
    # (an overlayfs image, mounted in a mount namespace of the test's own, where the
    # namespace's root can reach it: not under pytest's 0700 directory)
    layers = Path(tempfile.mkdtemp(prefix="sandbox-image-"))
    try:
        if image == "overlayfs":
            layers.chmod(0o755)
            for d in ("up", "work", "merged"):
                (layers / d).mkdir()
            spec["root"]["path"] = str(layers / "merged")
            command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                       f"mount -t overlay overlay -o lowerdir={rootfs_debian},upperdir={layers}/up,"
                       f"workdir={layers}/work {layers}/merged && exec \"$@\"", "sh", *command]
        (bundle / "config.json").write_text(json.dumps(spec))
        before = (mount_table(), tree(rootfs_debian))
        r = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split()[:2] == ["mine", "/dev/nvidia0"], (r.stdout, r.stderr)
        assert "libcuda.so.1: cuInit found" in r.stdout, r.stdout
        assert (mount_table(), tree(rootfs_debian)) == before
        assert image == "directory" or not os.listdir(layers / "up"), os.listdir(layers / "up")  # (the image as it was)
    finally:
        shutil.rmtree(layers)


def test_container_root_is_not_the_hosts(make_bundle, tmp_path):
    """A host directory of the host's root, 0700, bound in: root in the container is host uid
    100000 and cannot open it; without the user namespace it can."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("host only\n")
    mounts = [{"destination": "/root", "type": "bind", "source": str(private), "options": ["rbind"]}]
    for userns, expect in ((True, "cat: can't open '/root/secret': Permission denied"), (False, "host only")):
        bundle = (_bundle(make_bundle, ["sh", "-c", "cat /root/secret 2>&1"]) if userns
                  else make_bundle(["sh", "-c", "cat /root/secret 2>&1"]))
        spec = json.loads((bundle / "config.json").read_text())
        spec["mounts"] += mounts
        spec["process"]["capabilities"] = {k: ["CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH"] for k in
                                           ("bounding", "effective", "permitted")}
        (bundle / "config.json").write_text(json.dumps(spec))
        r = sandbox("run", bundle, "--root", tmp_path / "s")
        assert r.stdout.strip() == expect, (userns, r.stdout, r.stderr)


def test_create_exec_delete(make_bundle, tmp_path):
    bundle = _bundle(make_bundle, ["sleep", "30"])
    root = tmp_path / "state"
    cli = [*CLI, "--root", str(root)]
    assert create(root, bundle, "u1").returncode == 0
    try:
        assert subprocess.run([*cli, "start", "u1"], timeout=60).returncode == 0
        pid = json.loads(subprocess.run([*cli, "state", "u1"], capture_output=True, text=True).stdout)["pid"]
        with open(f"/proc/{pid}/uid_map") as f:
            assert f.read().split() == ["0", "100000", "65536"]
        assert os.stat(f"/proc/{pid}").st_uid == 100000  # the container's root, as the host sees it
        r = subprocess.run([*cli, "exec", "-u", "1000", "u1", "sh", "-c", "cat /proc/self/uid_map; id -u; ps -o pid"],
                           capture_output=True, text=True, timeout=60)
        # (pid 1, and the exec'd ps: 2 in Python's create, 3 in the launcher's, whose builder had 2)
        assert r.stdout.split()[:6] == ["0", "100000", "65536", "1000", "PID", "1"] and len(r.stdout.split()) == 7, \
            (r.stdout, r.stderr)
    finally:
        subprocess.run([*cli, "delete", "--force", "u1"], timeout=60)
    assert not os.path.exists("/sys/fs/cgroup/memory/u1")


@pytest.mark.parametrize("maps,words", [
    ({"uidMappings": [{"containerID": 0, "hostID": 100000, "size": 10}, {"containerID": 5, "hostID": 200000,
                                                                         "size": 10}]}, "linux.uidMappings"),
    ({"gidMappings": [{"containerID": 0, "hostID": 4294967290, "size": 100}]}, "linux.gidMappings"),
])
def test_a_mapping_the_kernel_refuses_is_one_line(maps, words, make_bundle, tmp_path, rootfs_debian):
    bundle = _bundle(make_bundle, ["true"], **maps)
    before = (mount_table(), tree(rootfs_debian))
    r = sandbox("run", bundle, "--root", tmp_path / "s")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
    assert (mount_table(), tree(rootfs_debian)) == before and not os.listdir(tmp_path / "s")


def test_root_in_there_cannot_write_the_image_nor_plant_setuid_files(make_bundle, tmp_path, rootfs_debian):
    """The image's files are the host's root's: in the namespace they are nobody's and root
    there may not write them, writable root or not, CAP_SYS_ADMIN in there or not (an
    idmapped root let it plant a setuid-root binary on the host's disk)."""
    script = ("cp /bin/busybox /planted 2>&1 | tail -1; echo x >> /etc/hostname 2>&1 | tail -1; "
              "mount -o remount,bind,rw / 2>&1 | tail -1; touch /planted2 2>&1 | tail -1")
    bundle = _bundle(make_bundle, ["sh", "-c", script])
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["readonly"] = False
    spec["process"]["capabilities"] = {k: ["CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_CHOWN"]
                                       for k in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps(spec))
    before = tree(rootfs_debian)
    r = sandbox("run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count("Permission denied") == 3, (r.stdout, r.stderr)
    assert tree(rootfs_debian) == before and not (rootfs_debian / "planted").exists()


def test_host_mount_locks_hold_in_there(make_bundle, tmp_path):
    """A bind source that is a read-only bind on the host, and one whose subdirectory a tmpfs
    covers: root in the namespace (CAP_SYS_ADMIN there) can neither remount the first rw nor
    lift the tmpfs off the second, as under runc: the sources are cloned from the locked
    copy of the host's mounts."""
    ro, covered = tmp_path / "ro", tmp_path / "covered"
    ro.mkdir()
    (ro / "file").write_text("host\n")
    (covered / "secret").mkdir(parents=True)
    (covered / "secret" / "under").write_text("hidden\n")
    bundle = _bundle(make_bundle, ["sh", "-c", "mount -o remount,bind,rw /ro 2>&1 | tail -1; "
                                               "echo changed > /ro/file 2>&1 | tail -1; "
                                               "umount /covered/secret 2>&1 | tail -1; ls /covered/secret"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] += [{"destination": "/ro", "type": "bind", "source": str(ro), "options": ["rbind"]},
                       {"destination": "/covered", "type": "bind", "source": str(covered), "options": ["rbind"]}]
    spec["process"]["capabilities"] = {k: ["CAP_SYS_ADMIN"] for k in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps(spec))
    script = (f"mount --bind -o ro {ro} {ro} && mount -o remount,bind,ro {ro} && "
              f"mount -t tmpfs tmpfs {covered}/secret && "
              f"{' '.join(CLI)} --root {tmp_path}/s run {bundle}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (ro / "file").read_text() == "host\n"
    assert "hidden" not in r.stdout and "under" not in r.stdout.split(), r.stdout


@pytest.mark.parametrize("gpu", [False, True])
def test_nobody_in_there_gains_no_image_directory(gpu, make_bundle, tmp_path, driver_root, rootfs_debian):
    """An image directory we overlay (for a new mount point, a GPU file) reads as owned by
    the overflow uid in there, a real uid of a wide map: the overlay's top is root's there,
    so that uid (the container's nobody) cannot write it. A small map works too."""
    target = "/usr/lib/x86_64-linux-gnu" if gpu else "/etc"
    script = f"touch {target}/pwned 2>&1 | tail -1; ls {target}/pwned 2>&1 | tail -1"
    for size in (65536, 1000):
        mapping = [{"containerID": 0, "hostID": 100000, "size": size}]
        bundle = _bundle(make_bundle, ["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else [],
                         uidMappings=mapping, gidMappings=mapping)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"]["readonly"] = False
        spec["process"]["user"] = {"uid": 999, "gid": 999} if size == 1000 else {"uid": 65534, "gid": 65534}
        if not gpu:
            spec["mounts"].append({"destination": "/etc/newfile", "type": "bind", "source": "/dev/null",
                                   "options": ["bind"]})
        (bundle / "config.json").write_text(json.dumps(spec))
        r = sandbox("run", bundle, "--root", tmp_path / "s", "--driver-root", driver_root)
        assert r.returncode == 0, (size, r.stderr)
        assert "Permission denied" in r.stdout and "No such file" in r.stdout, (size, r.stdout)
    assert not (rootfs_debian / target.lstrip("/") / "pwned").exists()


@pytest.mark.parametrize("userns", [True, False])
def test_a_killed_run_leaves_no_cgroup_and_no_state(userns, make_bundle, tmp_path):
    """SIGKILL the supervisor of `sandbox run`: the gofer (in a user namespace, its keeper
    outside it) kills the container and removes the cgroups and the state directory."""
    args = ["sh", "-c", "echo started; exec sleep 300"]
    bundle = _bundle(make_bundle, args) if userns else make_bundle(args)
    spec = json.loads((bundle / "config.json").read_text())
    rel = f"sandbox-keeper-{os.getpid()}-{int(userns)}"
    spec["linux"]["cgroupsPath"] = "/" + rel
    (bundle / "config.json").write_text(json.dumps(spec))
    dirs = [os.path.join("/sys/fs/cgroup", c, rel) for c in ("memory", "pids", "devices")]
    root = tmp_path / "s"
    p = subprocess.Popen([*CLI, "--root", str(root), "run", str(bundle), "--id", "kept"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started", p.stderr.read()
        assert all(os.path.isdir(d) for d in dirs) and (root / "kept").is_dir()
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (any(os.path.exists(d) for d in dirs) or (root / "kept").exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [d for d in dirs if os.path.exists(d)], "cgroups left behind"
        assert not (root / "kept").exists(), "state directory left behind"
    finally:
        p.kill()
        p.wait()
        for d in dirs:  # (the old code left them)
            if os.path.isdir(d):
                for pid in open(os.path.join(d, "cgroup.procs")).read().split():
                    os.kill(int(pid), 9)
                time.sleep(0.1)
                os.rmdir(d)
