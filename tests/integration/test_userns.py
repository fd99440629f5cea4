"""User namespaces with uid/gid mappings (runc's way: the user namespace owns the container's
other namespaces), with and without GPUs, for run, create/start and exec."""

from __future__ import annotations

import json
import os
import subprocess

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
    """The maps, the ids and the capabilities read the same as under runc; the rootfs (the
    host's root's files) belongs to the container's root through an idmapped mount (under
    runc it shows as nobody: the only difference)."""
    bundle = _bundle(make_bundle, ["sh", "-c", PROBE])
    before = (mount_table(), tree(rootfs_debian))
    ours = sandbox("run", bundle, "--root", tmp_path / "s")
    theirs = runc_run(bundle, tmp_path / "runc", f"un{os.getpid()}")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    lines, runc_lines = ours.stdout.splitlines(), theirs.stdout.splitlines()
    assert lines[0].split() == lines[1].split() == ["0", "100000", "65536"]
    assert lines[3] == "root root" and runc_lines[3] == "nobody nogroup"
    assert lines[:3] + lines[4:] == runc_lines[:3] + runc_lines[4:]
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
        assert r.stdout.split() == ["0", "100000", "65536", "1000", "PID", "1", "2"], (r.stdout, r.stderr)
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
