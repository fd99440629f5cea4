"""The files beyond the libraries, in a running container: DRI nodes and their by-path links,
MIG caps nodes (allowed in the devices cgroup), Xorg modules, nvoptix.bin, and CUDA forward
compatibility as glibc's own loader resolves it."""

from __future__ import annotations

import os
import re
import shutil

import fixtures
import pytest

from tests.integration.helpers import sandbox

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def run(bundle, driver_root, tmp_path):
    return sandbox("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")


SCRIPT = """
for f in /dev/dri/* /dev/dri/by-path/* /dev/nvidia-caps/*; do
  if [ -L $f ]; then echo "$f -> $(readlink $f)"; elif [ -c $f ]; then echo "$f $(stat -c '%t:%T' $f)"; fi
done
head -c1 /dev/nvidia-caps/nvidia-cap23 2>&1 | tail -1
head -c1 /dev/dri/renderD129 2>&1 | tail -1
for f in /usr/lib/xorg/modules/drivers/nvidia_drv.so /usr/share/nvidia/nvoptix.bin \
         /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so; do [ -f $f ] && echo "file $f"; done
true
"""


def test_graphics_display_and_mig_nodes_in_the_container(make_bundle, driver_root, tmp_path):
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=1,0:2:1",
                                                "NVIDIA_DRIVER_CAPABILITIES=graphics,display,utility"])
    r = run(bundle, driver_root, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    caps = f"{fixtures.CAPS_MAJOR:x}"
    assert lines[:6] == [
        "/dev/dri/card2 e2:2", "/dev/dri/renderD129 e2:81",  # 226:2, 226:129: GPU 1's only
        "/dev/dri/by-path/pci-0000:86:00.0-card -> ../card2",
        "/dev/dri/by-path/pci-0000:86:00.0-render -> ../renderD129",
        f"/dev/nvidia-caps/nvidia-cap21 {caps}:15", f"/dev/nvidia-caps/nvidia-cap23 {caps}:17",  # GI 2, CI 1
    ], r.stdout
    # allowed by the devices cgroup: the open reaches the (absent) driver, ENXIO, not EPERM
    assert all("No such device or address" in line for line in lines[6:8]), r.stdout
    assert lines[8:] == ["file /usr/lib/xorg/modules/drivers/nvidia_drv.so", "file /usr/share/nvidia/nvoptix.bin",
                         "file /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"], r.stdout


def test_cuda_compat_is_what_glibc_loads(make_bundle, driver_root, driver_version, rootfs_debian, tmp_path):
    """An image with a forward-compatible libcuda of a newer branch: glibc's loader (asked
    for libcuda.so.1 by cudacheck, LD_DEBUG=libs) finds it through our cache, before ours."""
    root = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    real = driver_root / fixtures.NV_DIR / f"libcuda.so.{driver_version}"
    shutil.copy(real, compat / "libcuda.so.550.54.15")  # the same ELF, a newer branch's name
    (compat / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    bundle = make_bundle(["sh", "-c", "LD_DEBUG=libs cudacheck 2>&1 | grep -E 'trying file=.*libcuda|cuInit'"],
                         ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=root)
    r = run(bundle, driver_root, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [re.sub(r"^\s*[0-9]+:\s*", "", line) for line in r.stdout.splitlines()]  # LD_DEBUG's pid prefix
    assert lines == ["trying file=/usr/local/cuda/compat/libcuda.so.1", "libcuda.so.1: cuInit found"], r.stdout
    assert sorted(os.listdir(compat)) == ["libcuda.so.1", "libcuda.so.550.54.15"]  # the image as it was


def test_a_rewritten_loader_file_is_what_the_container_reads(make_bundle, driver_root, tmp_path):
    import subprocess

    user = tmp_path / "driver"
    user.mkdir()
    for d in ("etc", "usr", "lib", "proc", "dev", "var"):  # hard links, never written through
        subprocess.run(["cp", "-al", str(driver_root / d), str(user / d)], check=True)
    ocl = user / "etc/OpenCL/vendors/nvidia.icd"
    ocl.unlink()
    ocl.write_text("/opt/nvidia/lib/libnvidia-opencl.so.1\n")
    bundle = make_bundle(["sh", "-c", "cat /etc/OpenCL/vendors/nvidia.icd; touch /etc/OpenCL/vendors/nvidia.icd"],
                         ["NVIDIA_VISIBLE_DEVICES=0"])
    r = run(bundle, user, tmp_path)
    assert r.stdout == "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1\n", (r.stdout, r.stderr)
    assert "Read-only file system" in r.stderr and r.returncode == 1, r.stderr
    assert ocl.read_text() == "/opt/nvidia/lib/libnvidia-opencl.so.1\n"  # the host's file as it was
