"""The plan as a pure function: inventories and layouts built here, no fixture, no root, and
no file read while planning (every call that would reach the disk fails under ``no_disk``)."""

from __future__ import annotations

import builtins
import contextlib
import os

import msgspec
import pytest

from mounts import actions as A
from mounts.driver_facts import DeviceNode, DriverLib, Gpu, Inventory, Mig
from mounts.errors import DriverError, ElfError, RequestError
from mounts.layout import Layout
from mounts.ldcache import FLAGS_I386, FLAGS_X86_64
from mounts.plan import compute_plan, iter_plan, loader_file
from mounts.request import GpuRequest

V = "535.1.2"
D = "/drv/usr/lib/x86_64-linux-gnu"
DEB = Layout("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
CU = frozenset({"compute", "utility"})
GPUS = [Gpu(0, 0, "GPU-00000000-0000-0000-0000-0000000000aa", "00000000:3b:00.0", "Tesla T4"),
        Gpu(1, 1, "GPU-00000000-0000-0000-0000-0000000000bb", "00000000:86:00.0", "NVIDIA A100")]


@contextlib.contextmanager
def no_disk():
    """Every way Python reaches a file fails inside: the plan must not need one."""
    def refuse(*args, **kw):
        raise AssertionError(f"the plan touched the disk: {args[:1]}")

    saved = {(mod, name): getattr(mod, name) for mod in (os, builtins)
             for name in ("open", "stat", "lstat", "listdir", "scandir", "readlink", "access", "pread")
             if hasattr(mod, name)}
    try:
        for mod, name in saved:
            setattr(mod, name, refuse)
        yield
    finally:
        for (mod, name), value in saved.items():
            setattr(mod, name, value)


def lib(key: str, name: str, soname: str | None, needed=(), flags=FLAGS_X86_64, broken=None) -> DriverLib:
    return DriverLib(key, f"{D}/{name}", name, flags, soname, tuple(needed), broken)


def node(name: str, major: int, minor: int) -> tuple[str, DeviceNode]:
    return name, DeviceNode(f"/dev/{name}", f"/drv/dev/{name}", major, minor)


def inventory(**changes) -> Inventory:
    inv = Inventory(
        root="/drv", dev_root="/drv", version=V, gpus=GPUS,
        devices=dict([node("nvidiactl", 195, 255), node("nvidia0", 195, 0), node("nvidia1", 195, 1),
                      node("nvidia-uvm", 511, 0), node("nvidia-uvm-tools", 511, 1), node("nvidia-modeset", 195, 254),
                      node("dri/card1", 226, 1), node("dri/renderD128", 226, 128)]),
        libraries=[
            lib("libcuda.so.1", f"libcuda.so.{V}", "libcuda.so.1", ["libnvidia-gpuhelper.so.1", "libc.so.6"]),
            lib("libcuda.so", f"libcuda.so.{V}", "libcuda.so.1", ["libnvidia-gpuhelper.so.1"]),
            lib("libnvidia-gpuhelper.so.1", f"libnvidia-gpuhelper.so.{V}", "libnvidia-gpuhelper.so.1"),
            lib("libnvidia-ml.so.1", f"libnvidia-ml.so.{V}", "libnvidia-ml.so.1"),
            lib("libGLX_nvidia.so.0", f"libGLX_nvidia.so.{V}", "libGLX_nvidia.so.0", [f"libnvidia-glcore.so.{V}"]),
            lib(f"libnvidia-glcore.so.{V}", f"libnvidia-glcore.so.{V}", f"libnvidia-glcore.so.{V}"),
        ],
        firmware={f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin": f"/drv/lib/firmware/nvidia/{V}/gsp_tu10x.bin"},
        dri={"00000000:3b:00.0": ("dri/card1", "dri/renderD128")},
        binaries={"nvidia-smi": "/drv/usr/bin/nvidia-smi", "nvidia-cuda-mps-control": "/drv/usr/bin/nvidia-cuda-mps-control"},
        configs={"/etc/OpenCL/vendors/nvidia.icd": "/drv/etc/OpenCL/vendors/nvidia.icd",
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": "/drv/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                 "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json": "/drv/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"},
        loader_texts={"/etc/OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1\n",
                      "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": '{"ICD": {"library_path": "libEGL_nvidia.so.0"}}'},
        xorg={"/usr/lib/xorg/modules/drivers/nvidia_drv.so": "/drv/usr/lib/nvidia/current/nvidia_drv.so",
              f"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{V}": f"/drv/usr/lib/nvidia/current/libglxserver_nvidia.so.{V}"},
        ipc={"/var/run/nvidia-persistenced/socket": "/drv/var/run/nvidia-persistenced/socket"},
        procfs="/drv/proc/driver/nvidia",
    )
    return msgspec.structs.replace(inv, **changes)


def plan(devices=("all",), caps=CU, inv=None, layout=DEB, **request) -> list[A.AnyAction]:
    req = GpuRequest(tuple(devices), frozenset(caps), **request)
    inv = inv or inventory()
    with no_disk():
        return list(iter_plan(req, inv, layout))


def test_a_compute_container_in_streaming_order():
    """Nodes, then each library as the closure reaches it (the selected ones in the cache's
    order, then what they need) with its SONAME link, the extra
    link, binaries, firmware, the loaders' files, IPC, /proc and last the cache."""
    got = [(a.kind, a.target) for a in plan()]
    L = "/usr/lib/x86_64-linux-gnu"
    assert got == [
        ("device", "/dev/nvidiactl"), ("device", "/dev/nvidia-uvm"), ("device", "/dev/nvidia-uvm-tools"),
        ("device", "/dev/nvidia0"), ("device", "/dev/nvidia1"),
        ("library", f"{L}/libcuda.so.{V}"), ("symlink", f"{L}/libcuda.so.1"),
        ("library", f"{L}/libnvidia-ml.so.{V}"), ("symlink", f"{L}/libnvidia-ml.so.1"),
        ("library", f"{L}/libnvidia-gpuhelper.so.{V}"), ("symlink", f"{L}/libnvidia-gpuhelper.so.1"),
        ("symlink", f"{L}/libcuda.so"),
        ("binary", "/usr/bin/nvidia-cuda-mps-control"), ("binary", "/usr/bin/nvidia-smi"),
        ("firmware", f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin"),
        ("config", "/etc/OpenCL/vendors/nvidia.icd"),
        ("ipc", "/var/run/nvidia-persistenced/socket"),
        ("procfs", "/proc/driver/nvidia"),
        ("ldcache", "/etc/ld.so.cache"),
    ]


def test_the_cache_names_each_soname_and_the_extra_link():
    (cache,) = [a for a in plan() if isinstance(a, A.LdCache)]
    L = "/usr/lib/x86_64-linux-gnu"
    assert [(e.key, e.value) for e in cache.entries] == [
        ("libcuda.so.1", f"{L}/libcuda.so.1"), ("libnvidia-ml.so.1", f"{L}/libnvidia-ml.so.1"),
        ("libnvidia-gpuhelper.so.1", f"{L}/libnvidia-gpuhelper.so.1"), ("libcuda.so", f"{L}/libcuda.so")]


def test_the_closure_takes_needed_driver_libraries():
    """libnvidia-gpuhelper is in no capability's list: only libcuda's DT_NEEDED brings it
    (its libc.so.6 is not the driver's: discovery never lists it)."""
    utility = [a.target for a in plan(caps={"utility"}) if a.kind == "library"]
    assert not any("gpuhelper" in t for t in utility)
    compute = [a.target for a in plan(caps={"compute"}) if a.kind == "library"]
    assert any("gpuhelper" in t for t in compute)


def test_a_broken_library_fails_only_the_containers_that_need_it():
    libs = inventory().libraries
    broken = [lib if "GLX" not in lib.key else msgspec.structs.replace(lib, soname=None, broken="libGLX: bad magic")
              for lib in libs]
    inv = inventory(libraries=broken)
    assert plan(inv=inv)  # compute: never reaches libGLX
    with pytest.raises(ElfError, match="libGLX: bad magic"):
        plan(caps={"graphics"}, inv=inv)


def test_one_gpu_by_index_uuid_and_bus_id():
    for name in ("1", GPUS[1].uuid.lower(), "0000:86:00.0"):
        devices = [a.target for a in plan([name]) if a.kind == "device"]
        assert "/dev/nvidia1" in devices and "/dev/nvidia0" not in devices
    with pytest.raises(RequestError, match=r"unknown device '7' \(2 GPUs under /drv\)"):
        plan(["7"])


def test_a_missing_node_is_an_error_only_when_required():
    devices = dict(inventory().devices)
    del devices["nvidia-uvm"], devices["nvidia-uvm-tools"]
    assert "/dev/nvidia-uvm" not in [a.target for a in plan(inv=inventory(devices=devices))]
    del devices["nvidia1"]
    with pytest.raises(RequestError, match="^/drv/dev/nvidia1: device node missing$"):
        plan(inv=inventory(devices=devices))


def test_graphics_and_display():
    """graphics: the GPU's DRI nodes and udev's by-path links, the GL closure, the EGL files
    (platform files included); display: modeset and Xorg's modules with the GLX link."""
    got = plan(["0"], caps={"graphics", "display"})
    targets = [a.target for a in got]
    assert {"/dev/nvidia-modeset", "/dev/dri/card1", "/dev/dri/renderD128",
            "/dev/dri/by-path/pci-0000:3b:00.0-card", "/dev/dri/by-path/pci-0000:3b:00.0-render"} <= set(targets)
    assert f"/usr/lib/x86_64-linux-gnu/libnvidia-glcore.so.{V}" in targets
    assert "/usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0" in targets
    assert [a.target for a in got if a.kind == "config"] == [
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"]
    assert "/usr/lib/xorg/modules/drivers/nvidia_drv.so" in targets
    links = {a.target: a.source for a in got if a.kind == "symlink"}
    assert links["/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"] == f"libglxserver_nvidia.so.{V}"
    assert "/dev/nvidia-uvm" not in targets and not any(a.kind == "binary" for a in got)


def test_a_lib64_layout_and_compat32():
    lib32 = lib("libcuda.so.1", f"libcuda.so.{V}", "libcuda.so.1", flags=FLAGS_I386)
    inv = inventory(libraries=inventory().libraries + [lib32])
    layout = Layout("/usr/lib64", "/usr/lib")
    without = [a.target for a in plan(caps={"compute"}, inv=inv, layout=layout) if a.kind == "library"]
    assert f"/usr/lib64/libcuda.so.{V}" in without and not any(t.startswith("/usr/lib/lib") for t in without)
    got = plan(caps={"compute", "compat32"}, inv=inv, layout=layout)
    assert f"/usr/lib/libcuda.so.{V}" in [a.target for a in got]
    (cache,) = [a for a in got if isinstance(a, A.LdCache)]
    assert ("libcuda.so.1", "/usr/lib/libcuda.so.1", FLAGS_I386) in [(e.key, e.value, e.flags) for e in cache.entries]


@pytest.mark.parametrize("compat, first", [("545.23.08", True), ("530.30.02", False)])
def test_cuda_forward_compatibility_puts_the_images_libcuda_first_only_when_newer(compat, first):
    layout = msgspec.structs.replace(DEB, compat_version=compat, compat=("libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"))
    (cache,) = [a for a in plan(layout=layout) if isinstance(a, A.LdCache)]
    top = (cache.entries[0].key, cache.entries[0].value)
    assert (top == ("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1")) is first
    assert [e.key for e in cache.entries].count("libcuda.so.1") == 1


def test_mig_devices_their_parent_and_the_toolkits_mig_capabilities():
    migs = [Mig(0, 1, 0, gi_cap=21, ci_cap=22)]
    devices = dict(inventory().devices) | dict([node("nvidia-caps/nvidia-cap21", 508, 21),
                                                node("nvidia-caps/nvidia-cap22", 508, 22),
                                                node("nvidia-caps/nvidia-cap1", 508, 1)])
    inv = inventory(migs=migs, devices=devices, mig_caps={"config": 1})
    got = plan(["0:1:0"], inv=inv)
    targets = [a.target for a in got]
    assert {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"} <= set(targets)
    assert "/dev/nvidia1" not in targets
    (proc,) = [a for a in got if isinstance(a, A.ProcFs)]
    assert proc.gpus == ("00000000:3b:00.0",) and proc.files == (
        "capabilities/gpu0/mig/gi1/access", "capabilities/gpu0/mig/gi1/ci0/access")
    assert "/dev/nvidia-caps/nvidia-cap1" in [a.target for a in plan(inv=inv, mig_config=("all",))]
    with pytest.raises(RequestError, match="NVIDIA_MIG_CONFIG_DEVICES: only for a container of whole GPUs"):
        plan(["0:1:0"], inv=inv, mig_config=("all",))
    with pytest.raises(RequestError, match="no MIG monitor capability"):
        plan(inv=inv, mig_monitor=("all",))
    with pytest.raises(RequestError, match=r"unknown MIG device '0:2:0'"):
        plan(["0:2:0"], inv=inv)


def test_imex_channels():
    devices = dict(inventory().devices) | dict([node("nvidia-caps-imex-channels/channel0", 234, 0),
                                                node("nvidia-caps-imex-channels/channel2", 234, 2)])
    inv = inventory(devices=devices)
    assert [a.target for a in plan(inv=inv, imex=("all",)) if "imex" in a.target] == [
        "/dev/nvidia-caps-imex-channels/channel0", "/dev/nvidia-caps-imex-channels/channel2"]
    with pytest.raises(RequestError, match="channel 1 not found"):
        plan(inv=inv, imex=("1",))


def test_no_gpu_and_none():
    assert compute_plan(None, None, DEB).actions == []
    got = plan([])
    assert [a.target for a in got if a.kind == "device"][:1] == ["/dev/nvidiactl"]
    assert not any(a.target.startswith("/dev/nvidia0") for a in got) and any(a.kind == "library" for a in got)


def test_a_loader_file_names_the_containers_64_bit_library():
    target = "/usr/share/vulkan/icd.d/nvidia_icd.json"
    made = {"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0": FLAGS_X86_64,
            "/usr/lib/i386-linux-gnu/libGLX_nvidia.so.0": FLAGS_I386}

    def fixed(text, made=made, target=target):
        inv = inventory(configs={target: "/drv" + target}, loader_texts={target: text})
        with no_disk():
            return loader_file(inv, target, made)

    for bad in ("[" * 5000 + "]" * 5000, '{"layers": 5, "ICD": true}', "not json",
                '{"ICD": {"library_path": "libGLX_nvidia.so.0"}}'):  # (by name: bound as it is)
        assert fixed(bad) is None
    for order in (1, -1):
        text = '{"ICD": {"library_path": "/usr/lib64/libGLX_nvidia.so.0"}}'
        assert '"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0"' in fixed(text, dict(list(made.items())[::order]))
    assert '"library_path":"libGLX_nvidia.so.0"' in fixed('{"ICD": {"library_path": "/opt/x/libGLX_nvidia.so.0"}}', {})
    icd = "/etc/OpenCL/vendors/nvidia.icd"
    assert fixed("/usr/lib64/libnvidia-opencl.so.1\n", {}, icd) == "libnvidia-opencl.so.1\n"
    with pytest.raises(DriverError, match=r"^/drv/usr/share/vulkan/icd.d/nvidia_icd.json: \d+ bytes, too large"):
        fixed('{"ICD": {"library_path": "/x/libGLX_nvidia.so.0", "pad": "' + "x" * 70000 + '"}}', {})
