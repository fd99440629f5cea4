"""Hostile images (CVE-2024-0132/0133/0134, CVE-2025-23359): symlinked lib dirs, /etc,
/usr/bin and /dev, library names that are links to host paths, `..` climbs. Whatever the
run's outcome, nothing outside the rootfs is created, mounted or written, nothing of the host
shows inside, and the image is unchanged."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.integration.helpers import mount_table, sandbox, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

LIB = "usr/lib/x86_64-linux-gnu"
SCRIPT = "ls /usr/lib/x86_64-linux-gnu/ /etc /usr/bin; cat /usr/lib/x86_64-linux-gnu/host-secret; true"


@pytest.fixture
def host_dir(tmp_path):
    """A host directory the image's links point at; it must stay exactly as it is."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "host-secret").write_text("secret of the host\n")
    (d / "libcuda.so.1").write_text("host file\n")
    return d


def _break(root, path, target):
    p = root / path
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to(target)


CASES = {
    "libdir-to-host-root": [(LIB, "/")],
    "libdir-to-host-dir": [(LIB, "{host}")],
    "libdir-climbs": [(LIB, "../../../../../../../../..")],
    "libdir-climbs-to-host-dir": [(LIB, "../../../../../../../../..{host}")],
    "etc-to-host-etc": [("etc", "/etc")],
    "etc-to-host-dir": [("etc", "{host}")],
    "usrbin-to-host-dir": [("usr/bin", "../../../../../../..{host}")],
    "dev-to-host-dev": [("dev", "/dev")],
    "libnames-to-host-files": [(f"{LIB}/libcuda.so.{{version}}", "{host}/libcuda.so.1"),
                               (f"{LIB}/libcuda.so.1", "{host}/libcuda.so.1"),
                               (f"{LIB}/libnvidia-ml.so.1", "/etc/passwd"),
                               ("etc/ld.so.cache", "{host}/host-secret")],
    "firmware-parent-to-host": [("lib/firmware", "{host}")],
    # a spec mount whose destination is the root itself: /dev's tmpfs and nodes landed in the image
    "dev-to-root": [("dev", "/")],
    "dev-climbs-to-root": [("dev", "../../..")],
    "proc-to-root": [("proc", "/")],
    "sys-to-root": [("sys", ".")],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_rootfs(case, tmp_path, host_dir, rootfs_debian, driver_root, driver_version, make_bundle):
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "usr/bin/sh").unlink()
    shutil.copy2(rootfs_debian / "usr/bin/busybox", root / "sh")  # a shell that survives usr/bin games
    for path, target in CASES[case]:
        _break(root, path.format(version=driver_version), target.format(host=host_dir))
    bundle = make_bundle(["/sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    watched = {"/": os.listdir("/"), "/etc": sorted(os.listdir("/etc")), "/dev": sorted(os.listdir("/dev"))}
    before = (mount_table(), tree(host_dir), tree(root), os.stat("/etc/passwd").st_mtime_ns)

    r = sandbox("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")
    print(case, r.returncode, r.stderr.strip().splitlines()[-1:], file=open("/tmp/hostile.log", "a"))

    assert mount_table() == before[0], "a mount leaked to the host"
    assert tree(host_dir) == before[1], "the host directory changed"
    assert tree(root) == before[2], "the image changed"
    assert os.stat("/etc/passwd").st_mtime_ns == before[3]
    assert {"/": os.listdir("/"), "/etc": sorted(os.listdir("/etc")), "/dev": sorted(os.listdir("/dev"))} == watched
    if r.returncode != 0:
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # the warning line + one error line
        assert r.stderr.strip().splitlines()[-1].startswith("sandbox run: ")
    # nothing of the host shows inside: not its root, its /etc, nor the linked host dir
    assert "secret of the host" not in r.stdout
    listing = r.stdout.split()
    assert "work" not in listing and "host-secret" not in listing


def test_fifo_as_ld_so_cache_does_not_hang(tmp_path, rootfs_debian, driver_root, make_bundle):
    """An image whose /etc/ld.so.cache is a FIFO: the gofer must not block opening it; the
    container gets a cache of the driver's entries alone and starts."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "etc/ld.so.cache").unlink()
    os.mkfifo(root / "etc/ld.so.cache")
    bundle = make_bundle(["cudacheck"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    before = tree(root)
    r = sandbox("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state", timeout=30)
    assert r.returncode == 0 and "cuInit found" in r.stdout, r.stderr
    assert tree(root) == before


@pytest.mark.parametrize("link", ["dev", "tmp"])
def test_spec_mount_onto_a_link_to_the_root_leaves_the_image_alone(link, tmp_path, rootfs_debian, make_bundle):
    """No GPU (no overlay root): an image whose /dev or /tmp is a link to "/", under the
    spec's tmpfs on it, linux.devices and a bind needing a new mount point. The tmpfs used to
    cover the root and the nodes (a disk among them) were made in the image itself."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    _break(root, link, "/")
    bundle = make_bundle(["true"], rootfs=root)
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["devices"] = [{"path": "/dev/vdb", "type": "b", "major": 254, "minor": 0, "fileMode": 438}]
    spec["mounts"] += [{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
                       {"destination": "/data", "type": "bind", "source": str(tmp_path), "options": ["rbind"]}]
    (bundle / "config.json").write_text(json.dumps(spec))
    before = (mount_table(), tree(root))
    r = sandbox("run", bundle, "--root", tmp_path / "state")
    assert (mount_table(), tree(root)) == before, "the image changed"
    assert r.returncode == 1 and r.stderr.strip() == (
        f"sandbox run: /{link}: resolves to the container's root (a symlink to / in the image?)"), r.stderr


@pytest.mark.parametrize("mount", [
    {"destination": "/proc", "type": "bind", "source": "{fake}", "options": ["rbind"]},
    {"destination": "/proc/self", "type": "bind", "source": "{fake}", "options": ["rbind"]},
    {"destination": "/proc/sys", "type": "tmpfs", "source": "tmpfs", "options": []},
])
def test_nothing_but_procfs_on_proc(mount, make_bundle, tmp_path):
    """An image's VOLUME /proc (CVE-2019-16884's way): refused in one line, as runc does."""
    fake = tmp_path / "fake"
    fake.mkdir()
    bundle = make_bundle(["true"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"].append({k: v.format(fake=fake) if isinstance(v, str) else v for k, v in mount.items()})
    (bundle / "config.json").write_text(json.dumps(spec))
    r = sandbox("run", bundle, "--root", tmp_path / "state")
    line, = r.stderr.strip().splitlines()
    assert r.returncode == 1 and line.startswith(f"sandbox run: {mount['destination']}: ") and "/proc" in line, line


def test_a_link_into_proc_is_refused_as_its_target_would_be(tmp_path, rootfs_debian, make_bundle):
    """The same rule on where a destination leads: the image's /data -> /proc/sys under the
    spec's volume at /data would cover the container's procfs."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    _break(root, "data", "/proc/sys")
    fake = tmp_path / "fake"
    fake.mkdir()
    bundle = make_bundle(["true"], rootfs=root)
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": str(fake), "options": ["rbind"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    before = (mount_table(), tree(root))
    r = sandbox("run", bundle, "--root", tmp_path / "state")
    assert (mount_table(), tree(root)) == before
    assert r.returncode == 1 and r.stderr.strip().startswith("sandbox run: /data: leads into /proc"), r.stderr


def test_an_images_own_proc_is_never_used_by_us(tmp_path, rootfs_debian, make_bundle):
    """No procfs mounted: /proc is the image's directory, here with self/fd/N leading to a
    FIFO for every N. Looking up HOME must not open it (it hung the init, as root)."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    os.mkfifo(root / "fifo")
    (root / "proc/self/fd").mkdir(parents=True)
    for n in range(3, 64):
        os.symlink("/fifo", root / f"proc/self/fd/{n}")
    bundle = make_bundle(["sh", "-c", "echo $HOME"], rootfs=root)
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/proc"]
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.startswith("HOME=")]
    (bundle / "config.json").write_text(json.dumps(spec))
    r = sandbox("run", bundle, "--root", tmp_path / "state", timeout=30)
    assert r.returncode == 0 and r.stdout == "/root\n", (r.stdout, r.stderr)
