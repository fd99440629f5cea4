"""The gofer's mount code on the real kernel, in a private mount namespace of a child
process (unshare -m): apply a plan to a rootfs through sandbox.api.apply_plan and look at
the result from inside that namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.integration.helpers import mount_table, tree
from tests.integration.test_hostile import CASES, _break

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

CHILD = textwrap.dedent("""
    import json, os, sys
    from gofer import syscalls as sc
    from sandbox.api import apply_plan, plan_bundle
    args = json.loads(sys.argv[1])
    sc.OPENAT2_AVAILABLE = args["openat2"]
    def mounts():
        with open("/proc/self/mountinfo") as f:
            return sorted(l.split()[4] for l in f)
    plan = plan_bundle(args["bundle"], args["driver"])
    before = mounts()
    out = {"error": None, "error_type": None, "applied": 0}
    try:
        out["applied"] = apply_plan(plan.actions, args["rootfs"])
    except Exception as e:
        out["error"], out["error_type"] = str(e), type(e).__name__
    out["added"] = sorted(set(mounts()) - set(before))
    out["gone"] = sorted(set(before) - set(mounts()))
    lib = os.path.join(args["rootfs"], "usr/lib/x86_64-linux-gnu")
    out["lib"] = sorted(os.listdir(lib)) if os.path.isdir(lib) else None
    if out["error"] is None:  # probe the bound library (never the image after a failure)
        try:
            open(os.path.join(lib, "libcuda.so.1"), "ab").close()
            out["lib_writable"] = True
        except OSError as e:
            out["lib_writable"] = e.strerror
    print(json.dumps(out))
""")


def apply_in_child(bundle, rootfs, driver, openat2=True):
    arg = json.dumps({"bundle": str(bundle), "rootfs": str(rootfs), "driver": str(driver), "openat2": openat2})
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", CHILD, arg],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_apply_in_own_namespace(openat2, make_bundle, rootfs_debian, driver_root, driver_version):
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    host_before, tree_before = mount_table(), tree(rootfs_debian)
    out = apply_in_child(bundle, rootfs_debian, driver_root, openat2)
    assert out["error"] is None and out["applied"] > 20
    assert f"libcuda.so.{driver_version}" in out["lib"] and "libcuda.so.1" in out["lib"]
    assert "libc.so.6" in out["lib"]  # the image's own files stay visible through the overlay
    assert out["lib_writable"] == "Read-only file system"  # bound read-only (mount_setattr)
    assert any(m.endswith(f"/libcuda.so.{driver_version}") for m in out["added"])
    assert mount_table() == host_before and tree(rootfs_debian) == tree_before


def test_failed_apply_detaches_everything(make_bundle, tmp_path, rootfs_debian, driver_root):
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "bin").unlink()
    shutil.rmtree(root / "usr/bin")
    (root / "usr/bin").write_text("a file where a directory should be\n")
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    before = tree(root)
    out = apply_in_child(bundle, root, driver_root)
    assert "/usr/bin" in out["error"] and "not a directory" in out["error"]
    assert out["added"] == [] and out["gone"] == []  # the overlays and binds made before are gone
    assert tree(root) == before


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_rootfs_both_resolvers(case, openat2, tmp_path, rootfs_debian, driver_root, driver_version, make_bundle):
    """The hostile images again, through the API, with openat2 and with the O_PATH walk:
    every mount made lies inside the rootfs; the host dir and the image are unchanged."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "host-secret").write_text("secret\n")
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    for path, target in CASES[case]:
        _break(root, path.format(version=driver_version), target.format(host=host))
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    before = (tree(host), tree(root), mount_table())
    out = apply_in_child(bundle, root, driver_root, openat2=openat2)
    # the plan was applied, or refused as ours refuse (a one-line error of ours naming the
    # operation and path), never a crash
    assert out["applied"] > 20 or (out["error_type"] in ("MountError", "SyscallError")
                                   and "\n" not in out["error"]), out
    assert all(m.startswith(str(root) + "/") or m == str(root) for m in out["added"]), out["added"]
    assert (tree(host), tree(root), mount_table()) == before


def test_the_dir_cache_finds_what_a_mount_hides():
    """A new mount at a path hides the cached directories at and below it, and only those
    ("a/b-x" sorts between "a/b" and "a/b/c"); found by bisection, not a scan."""
    from gofer.root import _DirCache

    cache = _DirCache()
    for n, key in enumerate(["a", "a/b", "a/b-x", "a/b/c", "a/b/c/d", "a/bc", "b", "a/b0"]):
        cache[key] = n
    assert sorted(cache.at_or_below("a/b")) == ["a/b", "a/b/c", "a/b/c/d"]
    assert cache.at_or_below("a/b/c/d") == ["a/b/c/d"] and cache.at_or_below("z") == []
    assert sorted(cache.at_or_below("")) == sorted(cache)
    cache.pop("a/b/c")
    assert sorted(cache.at_or_below("a/b")) == ["a/b", "a/b/c/d"]
    cache.clear()
    assert cache.at_or_below("a") == [] and not cache
