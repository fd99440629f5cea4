"""linux.rootfsPropagation: a slave root receives what is mounted on the host under the
rootfs afterwards, a private one does not, a shared one does and is a peer group of its own
besides; none carries the container's mounts back to the host, but a bind volume with
shared propagation (Kubernetes' Bidirectional) does, as under runc."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.integration.helpers import CLI, mount_table

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

WATCH = ("touch /root/ready; for i in $(seq 20); do test -e /tmp/hello && { echo seen; break; }; sleep 0.1; done; "
         "test -e /tmp/hello || echo unseen; awk '$5==\"/\" {print ($7 ~ /^shared:/) ? \"root-shared\" : "
         "($7 ~ /^master:/) ? \"root-slave\" : \"root-private\"}' /proc/self/mountinfo; "
         "mount -t tmpfs tmpfs /tmp 2>/dev/null; true")


@pytest.mark.parametrize("prop,expect", [
    ("rslave", ["seen", "root-slave"]), ("slave", ["seen", "root-slave"]),
    ("rprivate", ["unseen", "root-private"]), (None, ["unseen", "root-private"]),
    ("rshared", ["seen", "root-shared"]), ("runbindable", ["unseen", "root-private"]),
])
def test_root_propagation(prop, expect, make_bundle, tmp_path, rootfs_debian):
    """The rootfs lives under a shared mount of the test's own namespace (as on a systemd
    host); the test mounts a tmpfs on its /tmp once the container runs."""
    top = tmp_path / "shared"
    top.mkdir()
    bundle = make_bundle(["sh", "-c", WATCH])
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["path"] = str(top / "rootfs")
    spec["process"]["capabilities"] = {k: ["CAP_SYS_ADMIN"] for k in ("bounding", "effective", "permitted")}
    if prop:
        spec["linux"]["rootfsPropagation"] = prop
    (tmp_path / "sig").mkdir()  # the container says it runs: the test mounts only then (at a
    # mount point the image has: a new one would need an overlay over the root, see design.md)
    spec["mounts"].append({"destination": "/root", "type": "bind", "source": str(tmp_path / "sig"),
                           "options": ["rbind"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    script = (f"mount -t tmpfs tmpfs {top} && mount --make-shared {top} && mkdir {top}/rootfs && "
              f"mount --bind {rootfs_debian} {top}/rootfs && "
              f"({CLI[0]} --root {tmp_path}/s run {bundle} & "
              f"while ! test -e {tmp_path}/sig/ready; do sleep 0.05; done; mount -t tmpfs tmpfs {top}/rootfs/tmp && touch {top}/rootfs/tmp/hello; wait) ; "
              f"grep -c ' {top}/rootfs/tmp ' /proc/self/mountinfo")
    before = mount_table()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    # the container's own tmpfs on /tmp (its last command) never reaches the test's tree
    assert r.stdout.split() == [*expect, "1"], (r.stdout, r.stderr)
    assert mount_table() == before


BIDI = ("mount -t tmpfs tmpfs /vol/in && echo from-container > /vol/in/file && touch /vol/mounted; "
        "for i in $(seq 100); do test -e /vol/out/file && break; sleep 0.05; done; cat /vol/out/file 2>&1; "
        "touch /vol/done; for i in $(seq 100); do test -e /vol/unmounted && break; sleep 0.05; done; "
        "umount /vol/in; true")


@pytest.mark.parametrize("gpu", [False, True])
def test_bidirectional_volume(gpu, make_bundle, tmp_path, driver_root):
    """Kubernetes' mountPropagation: Bidirectional, as containerd writes it (a bind with
    rshared, rootfsPropagation rshared) over a shared host mount, as critest tries it: a
    mount made in the container under the volume appears on the host, and the host's in the
    container. Nothing else of the container's reaches the host (its own tmpfs on /tmp), and
    a GPU container's root stays our overlay."""
    top = tmp_path / "shared"
    top.mkdir()
    bundle = make_bundle(["sh", "-c", BIDI + "; mount -t tmpfs tmpfs /tmp"],
                         ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_SYS_ADMIN"] for k in ("bounding", "effective", "permitted")}
    spec["linux"]["rootfsPropagation"] = "rshared"
    spec["mounts"].append({"destination": "/vol", "type": "bind", "source": str(top / "vol"),
                           "options": ["rbind", "rshared"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    vol = top / "vol"
    script = (f"mount -t tmpfs tmpfs {top} && mount --make-shared {top} && mkdir -p {vol}/in {vol}/out && "
              f"({CLI[0]} --root {tmp_path}/s --driver-root {driver_root} run {bundle} & "
              f"while ! test -e {vol}/mounted; do sleep 0.05; done; "
              f"cat {vol}/in/file; grep -c ' {vol}/in ' /proc/self/mountinfo; "
              f"mount -t tmpfs tmpfs {vol}/out && echo from-host > {vol}/out/file; "
              f"while ! test -e {vol}/done; do sleep 0.05; done; umount {vol}/out; touch {vol}/unmounted; wait); "
              f"grep -c ' {vol}/in ' /proc/self/mountinfo; grep -c ' /tmp ' /proc/self/mountinfo")
    before = mount_table()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    # the container's mount, seen here; the host's, seen there; its unmount, gone here too
    assert r.stdout.split() == ["from-container", "1", "from-host", "0", "0"], (r.stdout, r.stderr)
    assert mount_table() == before


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@pytest.mark.skipif(_kernel() < (6, 8), reason="before 6.8 the kernel lists mounts in the order they were "
                    "attached: an early clone reads in order whatever we do")
@pytest.mark.parametrize("userns", [False, True])
def test_a_shared_bind_reads_in_the_specs_order(userns, make_bundle, tmp_path):
    """A Bidirectional bind's source is cloned before the root is made (to stay a peer of
    the host's mount; in a user namespace every bind's is), but the container's mountinfo
    lists the spec's mounts in the spec's order all the same (runtime-tools' mounts test:
    newer kernels list mounts as they were made), /proc first, the shared bind between the
    tmpfs before and after it."""
    top = tmp_path / "shared"
    top.mkdir()
    bundle = make_bundle(["sh", "-c", "awk '{print $5}' /proc/self/mountinfo"])
    spec = json.loads((bundle / "config.json").read_text())
    if userns:
        spec["linux"]["namespaces"].append({"type": "user"})
        spec["linux"].update({k: [{"containerID": 0, "hostID": 100000, "size": 65536}]
                              for k in ("uidMappings", "gidMappings")})
    spec["mounts"] += [{"destination": "/before", "type": "tmpfs", "source": "tmpfs"},
                       {"destination": "/vol", "type": "bind", "source": str(top), "options": ["rbind", "rshared"]},
                       {"destination": "/after", "type": "tmpfs", "source": "tmpfs"}]
    (bundle / "config.json").write_text(json.dumps(spec))
    script = (f"mount -t tmpfs tmpfs {top} && mount --make-shared {top} && "
              f"{CLI[0]} --root {tmp_path}/s run {bundle}")
    before = mount_table()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    points = r.stdout.split()
    wanted = [m["destination"] for m in spec["mounts"]]
    assert [p for p in points if p in wanted] == wanted, points
    assert mount_table() == before
