"""/proc/driver/nvidia in the container (gofer/gpu.py proc_driver), on the real kernel in a
private mount namespace: its sources are taken beneath the driver's proc directory, never
through a link of a dev root's (to a host file) and never from a FIFO (that would hang)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

CHILD = textwrap.dedent("""
    import json, os, sys
    from mounts import actions as A
    from sandbox.api import apply_plan
    args = json.loads(sys.argv[1])
    action = A.ProcFs(args["source"], "/proc/driver/nvidia", ("nosuid", "nodev", "noexec"),
                      tuple(args["gpus"]), tuple(args["files"]))
    out = {"error": None, "seen": {}}
    try:
        apply_plan([action], args["rootfs"])
    except Exception as e:
        out["error"] = str(e)
    base = os.path.join(args["rootfs"], "proc/driver/nvidia")
    for d, _, files in os.walk(base):
        for f in files:
            with open(os.path.join(d, f)) as fh:
                out["seen"][os.path.relpath(os.path.join(d, f), base)] = fh.read()
    print(json.dumps(out))
""")


@pytest.fixture
def layout(tmp_path, driver_root, rootfs_debian):
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)  # what the container's procfs would show
    proc = tmp_path / "dev/proc/driver/nvidia"
    shutil.copytree(driver_root / "proc/driver/nvidia", proc, symlinks=True)
    secret = tmp_path / "host"
    secret.mkdir()
    (secret / "config").write_text("HOST SECRET\n")
    return root, proc, secret


def apply(root, source, gpus=(), files=()):
    arg = json.dumps({"rootfs": str(root), "source": str(source), "gpus": list(gpus), "files": list(files)})
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", CHILD, arg],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_mig_files_and_gpu_dirs_are_bound(layout):
    root, proc, _ = layout
    out = apply(root, proc, ["0000:3b:00.0"], ["capabilities/gpu0/mig/gi1/access", "capabilities/mig/config"])
    assert out["error"] is None, out
    assert out["seen"]["capabilities/gpu0/mig/gi1/access"].startswith("DeviceFileMinor: 12\n")
    assert "gpus/0000:3b:00.0/information" in out["seen"] and "ModifyDeviceFiles: 0" in out["seen"]["params"]
    assert os.listdir(root / "proc/driver/nvidia") == []  # the image as it was


def test_a_dev_roots_link_to_a_host_file_is_refused(layout):
    root, proc, secret = layout
    shutil.rmtree(proc / "capabilities/mig")
    (proc / "capabilities/mig").symlink_to(secret)
    out = apply(root, proc, files=["capabilities/mig/config"])
    assert "capabilities/mig/config" in out["error"] and "not a plain file or directory" in out["error"], out
    assert "HOST SECRET\n" not in out["seen"].values()
    (proc / "gpus/0000:3b:00.0").rename(proc / "gpu-real")
    (proc / "gpus/0000:3b:00.0").symlink_to(secret)
    out = apply(root, proc, gpus=["0000:3b:00.0"])
    assert "gpus/0000:3b:00.0" in out["error"], out
    assert "HOST SECRET\n" not in out["seen"].values()


def test_a_fifo_among_the_proc_files_is_an_error_not_a_hang(layout):
    root, proc, _ = layout
    (proc / "params").unlink()
    os.mkfifo(proc / "params")
    out = apply(root, proc)
    assert out["error"].endswith("params is not a regular file"), out
