import os
import shutil

import fixtures
import pytest

from mounts.catalog import EGL_PLATFORM_LIBS
from mounts.driver import discover
from mounts.driver_facts import cuda_version
from mounts.errors import DriverError


def test_discovers_the_real_535_driver(driver_root, driver_version):
    inv = discover(str(driver_root))
    assert inv.version == driver_version
    assert inv.cuda_version == "12.2"
    assert [(g.index, g.minor) for g in inv.gpus] == [(0, 0), (1, 1)]
    assert inv.gpus[0].uuid.startswith("GPU-") and inv.gpus[0].busid == "0000:3b:00.0"
    nodes = {n: (d.major, d.minor) for n, d in inv.devices.items()}
    assert nodes["nvidiactl"] == (195, 255) and nodes["nvidia1"] == (195, 1)
    assert nodes["nvidia-uvm"] == (fixtures.UVM_MAJOR, 0) and nodes["nvidia-uvm-tools"] == (fixtures.UVM_MAJOR, 1)
    assert inv.firmware and all(t.startswith(f"/lib/firmware/nvidia/{driver_version}/gsp") and os.path.isfile(h)
                                for t, h in inv.firmware.items())
    # every library is a real file carrying the version, found through the root's own cache
    # (the EGL external platform libraries have versions of their own)
    assert all(os.path.isfile(lib.path) and (lib.name.endswith(driver_version) or lib.key in EGL_PLATFORM_LIBS)
               for lib in inv.libraries)
    assert {lib.key for lib in inv.libraries} >= {"libnvidia-egl-wayland.so.1", "libnvidia-egl-gbm.so.1"}
    assert inv.binaries["nvidia-smi"].endswith("usr/lib/nvidia/current/nvidia-smi")


def test_version_from_library_names_without_proc(tmp_path, driver_root, driver_version):
    root = tmp_path / "root"
    shutil.copytree(driver_root / "etc", root / "etc", symlinks=True)
    shutil.copytree(driver_root / "usr/lib/x86_64-linux-gnu", root / "usr/lib/x86_64-linux-gnu", symlinks=True)
    inv = discover(str(root))
    assert inv.version == driver_version and inv.gpus == [] and inv.devices == {}


@pytest.mark.parametrize("branch,cuda", [("535.261.03", "12.2"), ("550.54.14", "12.4"),
                                         ("470.1", "11.4"), ("390.1", None)])
def test_cuda_version_by_branch(branch, cuda):
    assert cuda_version(branch) == cuda


def test_wrong_device_node_is_an_error(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    shutil.copy("/etc/ld.so.cache", root / "etc/ld.so.cache")
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.1.2  x\n")
    (root / "dev").mkdir()
    (root / "dev/nvidiactl").write_text("not a device")
    with pytest.raises(DriverError, match=r"dev/nvidiactl: expected char device 195:255"):
        discover(str(root))
    os.unlink(root / "dev/nvidiactl")
    os.mknod(root / "dev/nvidiactl", 0o600 | 0o020000, os.makedev(1, 3))
    with pytest.raises(DriverError, match=r"found char 1:3"):
        discover(str(root))


def test_missing_driver(tmp_path):
    with pytest.raises(DriverError, match="not a directory"):
        discover(str(tmp_path / "nope"))
    with pytest.raises(DriverError, match="no NVIDIA driver found .*no etc/ld.so.cache"):
        discover(str(tmp_path))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(b"garbage")
    with pytest.raises(DriverError, match="bad magic"):
        discover(str(tmp_path))
    shutil.copy("/etc/ld.so.cache", tmp_path / "etc/ld.so.cache")
    with pytest.raises(DriverError, match="no NVIDIA driver found"):
        discover(str(tmp_path))


def test_every_library_of_the_catalog_is_a_drivers_key():
    """Discovery resolves only cache entries whose names may be the driver's: a library the
    catalog names must never be among those skipped."""
    from mounts import catalog
    from mounts.driver import _drivers_key

    names = [n for group in catalog.LIBRARIES.values() for n in group] + list(catalog.EGL_PLATFORM_LIBS)
    assert names and [n for n in names if not _drivers_key(n)] == []
    assert not _drivers_key("libc.so.6") and not _drivers_key("libz.so.1")
