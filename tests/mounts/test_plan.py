"""The plan on the real 535 fixture, checked against the fixture's own files."""

import os

import pytest

from mounts import actions as A
from mounts.bundle import load_bundle
from mounts.driver import discover
from mounts.elf import read_elf
from mounts.errors import RequestError
from mounts.layout import Layout, layout_of
from mounts.plan import compute_plan
from mounts.request import gpu_request

GPU0 = "GPU-4d8f2f4a-6f6c-3b1e-9a1e-0d6f3c2b1a00"  # fixtures.GPUS[0], the one with MIG_LAYOUT
DEB = Layout("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
COMPUTE_UTILITY_LIBS = {"libcuda", "libcudadebugger", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
                        "libnvidia-allocator", "libnvidia-pkcs11-openssl3", "libnvidia-ml", "libnvidia-cfg", "libnvidia-opencl"}
GRAPHICS_LIBS = {"libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libnvidia-eglcore",
                 "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-glvkspirv",
                 "libnvidia-rtcore", "libnvidia-fbc", "libnvoptix", "libnvidia-egl-wayland", "libnvidia-egl-gbm"}
XORG_MODULES = {"nvidia_drv", "libglxserver_nvidia"}


@pytest.fixture(scope="module")
def inventory(driver_root):
    return discover(str(driver_root))


def plan_for(make_bundle, inventory, env, **kw):
    bundle = load_bundle(str(make_bundle(env=env)))
    return compute_plan(gpu_request(bundle.spec, **kw), inventory, layout_of(bundle.rootfs))


def by_kind(plan, kind):
    return [a for a in plan.actions if a.kind == kind]


def stems(plan, version):
    """The planned libraries' names without .so.<version>; only the EGL platform libraries
    and Xorg's driver module carry another version or none."""
    names = [os.path.basename(a.target) for a in by_kind(plan, "library")]
    other = {n for n in names if not n.endswith(".so." + version)}
    assert {n.split(".so")[0] for n in other} <= {"libnvidia-egl-wayland", "libnvidia-egl-gbm", "nvidia_drv"}
    return {n.split(".so")[0] for n in names}


def test_compute_utility_all(make_bundle, inventory, driver_root, driver_version):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert stems(plan, driver_version) == COMPUTE_UTILITY_LIBS
    for a in by_kind(plan, "library"):
        assert os.path.isfile(a.source) and a.source.startswith(str(driver_root))
        assert a.target.startswith("/usr/lib/x86_64-linux-gnu/") and a.flags == ("ro", "nosuid", "nodev")
    assert {os.path.basename(a.target) for a in by_kind(plan, "binary")} == {
        "nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}
    assert {a.target for a in by_kind(plan, "device")} == {
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1"}
    firmware = sorted(os.listdir(driver_root / f"lib/firmware/nvidia/{driver_version}"))
    assert [os.path.basename(a.target) for a in by_kind(plan, "firmware")] == firmware
    assert [a.target for a in by_kind(plan, "ipc")] == ["/var/run/nvidia-persistenced/socket"]
    assert {a.kind for a in plan.actions} == {"device", "library", "symlink", "binary", "firmware",
                                              "ipc", "config", "procfs", "ldcache"}
    assert [a.target for a in by_kind(plan, "config")] == ["/etc/OpenCL/vendors/nvidia.icd"]  # compute's
    assert plan.actions[-1].kind == "ldcache"


def test_symlinks_and_cache_follow_sonames(make_bundle, inventory, driver_version):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=all"])
    links = {a.target: a.source for a in by_kind(plan, "symlink")}
    for lib in by_kind(plan, "library"):
        soname = read_elf(lib.source).soname
        if soname != os.path.basename(lib.target):
            assert links[os.path.join(os.path.dirname(lib.target), soname)] == os.path.basename(lib.target)
    d = "/usr/lib/x86_64-linux-gnu"
    assert links[f"{d}/libcuda.so"] == "libcuda.so.1"
    (cache,) = by_kind(plan, "ldcache")
    keys = {e.key: e.value for e in cache.entries}
    assert keys["libcuda.so.1"] == f"{d}/libcuda.so.1" and keys["libnvidia-ml.so.1"] == f"{d}/libnvidia-ml.so.1"


def test_graphics_adds_gl_with_its_closure(make_bundle, inventory, driver_version):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=all",
                                             "NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics"])
    assert stems(plan, driver_version) == COMPUTE_UTILITY_LIBS | GRAPHICS_LIBS
    planned = {os.path.basename(a.target) for a in by_kind(plan, "library")}
    driver_names = {lib.name for lib in inventory.libraries} | {lib.key for lib in inventory.libraries}
    for lib in by_kind(plan, "library"):
        for needed in read_elf(lib.source).needed:
            if needed in driver_names:  # every driver library a planned one needs is planned
                assert needed in planned or any(
                    os.path.basename(a.target) == needed for a in by_kind(plan, "symlink")), needed
    links = {os.path.basename(a.target): a.source for a in by_kind(plan, "symlink")}
    assert links["libGLX_indirect.so.0"] == f"libGLX_nvidia.so.{driver_version}"


def test_one_gpu_by_index_uuid_and_busid(make_bundle, inventory):
    gpu1 = inventory.gpus[1]
    for value in ("1", gpu1.uuid, gpu1.busid, "00000000:" + gpu1.busid.split(":", 1)[1].upper()):
        plan = plan_for(make_bundle, inventory, [f"NVIDIA_VISIBLE_DEVICES={value}"])
        devs = {a.target for a in by_kind(plan, "device")}
        assert "/dev/nvidia1" in devs and "/dev/nvidia0" not in devs, value
        assert plan.gpus == [gpu1]


def test_none_gives_control_nodes_and_libraries(make_bundle, inventory):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=none"])
    devs = {a.target for a in by_kind(plan, "device")}
    assert devs == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert by_kind(plan, "library")


def test_no_gpu_empty_plan(make_bundle, inventory):
    assert plan_for(make_bundle, inventory, []).actions == []


def test_lib64_layout(make_bundle, inventory, rootfs_lib64):
    bundle = load_bundle(str(make_bundle(env=["NVIDIA_VISIBLE_DEVICES=0"], rootfs=rootfs_lib64)))
    layout = layout_of(bundle.rootfs)
    assert layout.lib64 == "/usr/lib64"
    plan = compute_plan(gpu_request(bundle.spec), inventory, layout)
    assert all(a.target.startswith("/usr/lib64/") for a in by_kind(plan, "library"))


@pytest.mark.parametrize("env,message", [
    (["NVIDIA_VISIBLE_DEVICES=7"], "NVIDIA_VISIBLE_DEVICES: unknown device '7'"),
    (["NVIDIA_VISIBLE_DEVICES=MIG-1234"], r"^MIG-1234: which MIG device this is only NVML knows, and NVML is "
     r"asked only of the host's own driver \(--driver-root /\); name it as GPU:GI:CI"),
    (["NVIDIA_VISIBLE_DEVICES=0:1"], r"^0:1: which MIG device this is only NVML knows"),  # cli's GPU:index
    (["NVIDIA_VISIBLE_DEVICES=1:1:0"], r"unknown MIG device '1:1:0' \(3 MIG devices under "),
    (["NVIDIA_VISIBLE_DEVICES=0:1:1"], "unknown MIG device '0:1:1'"),
    ([f"NVIDIA_VISIBLE_DEVICES=MIG-{GPU0}/3/0"], "unknown MIG device 'MIG-GPU-"),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"],
     r"requirement NVIDIA_REQUIRE_CUDA='cuda>=12.4' not met \(driver 535\.\d+\.\d+, CUDA 12.2\)"),
])
def test_request_errors(make_bundle, inventory, env, message):
    with pytest.raises(RequestError, match=message):
        plan_for(make_bundle, inventory, env)


@pytest.mark.parametrize("n", [10, 100])
def test_synthetic_closure_walks_the_whole_chain(n, make_bundle):
    import fixtures

    inv = discover(str(fixtures.synthetic_driver(n)))
    plan = plan_for(make_bundle, inv, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert len(by_kind(plan, "library")) == n
    assert len(by_kind(plan, "device")) == 2 + 2 + 1  # ctl, uvm, uvm-tools, two GPUs
    assert isinstance(plan.actions[-1], A.LdCache) and len(plan.actions[-1].entries) == n + 1


@pytest.mark.parametrize("caps,libs,devices,links", [
    ("video", COMPUTE_UTILITY_LIBS - {"libnvidia-ml", "libnvidia-cfg"}
     | {"libnvidia-encode", "libnvcuvid", "libnvidia-opticalflow"},
     {"/dev/nvidia-uvm"}, {"libnvidia-opticalflow.so", "libcuda.so"}),
    ("display", GRAPHICS_LIBS | XORG_MODULES, {"/dev/nvidia-modeset"}, {"libGLX_indirect.so.0"}),
    ("ngx", {"libnvidia-ngx"}, set(), set()),
    ("utility", {"libnvidia-ml", "libnvidia-cfg"}, set(), set()),
])
def test_capabilities(caps, libs, devices, links, make_bundle, inventory, driver_version):
    """Each capability brings its libraries (mounts/catalog.py LIBRARIES, closure included) and nodes."""
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"])
    assert stems(plan, driver_version) == libs
    got = {a.target for a in by_kind(plan, "device")}
    assert devices <= got and {"/dev/nvidiactl", "/dev/nvidia0"} <= got
    assert links <= {os.path.basename(a.target) for a in by_kind(plan, "symlink")}
    if caps == "utility":
        assert "/dev/nvidia-uvm" not in got and "/dev/nvidia-modeset" not in got


def test_mps_pipe_dir_only_if_present(tmp_path, make_bundle):
    import subprocess

    import fixtures

    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    inv = discover(str(root))
    assert by_kind(plan_for(make_bundle, inv, ["NVIDIA_VISIBLE_DEVICES=none"]), "ipc") == []
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    ipc = by_kind(plan_for(make_bundle, discover(str(root)), ["NVIDIA_VISIBLE_DEVICES=none"]), "ipc")
    assert [(a.target, a.flags) for a in ipc] == [("/tmp/nvidia-mps", ("nosuid", "nodev", "noexec"))]


def test_driver_container_layout(tmp_path, make_bundle, driver_root, driver_version):
    """GPU Operator style: the user-space files under one root (a driver container mounted at
    /run/nvidia/driver), the kernel's dev/ and proc/ under another (--dev-root)."""
    import subprocess

    user = tmp_path / "driver"
    user.mkdir()
    for d in ("etc", "usr", "lib"):  # hard links: the same files, no 400 MB copy
        subprocess.run(["cp", "-al", str(driver_root / d), str(user / d)], check=True)
    inv = discover(str(user), str(driver_root))
    plan = plan_for(make_bundle, inv, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert inv.version == driver_version and len(plan.gpus) == 2
    assert all(a.source.startswith(str(user)) for a in by_kind(plan, "library"))
    assert all(a.source.startswith(f"{driver_root}/dev/") for a in by_kind(plan, "device"))
    with pytest.raises(RequestError, match=f"{user}/dev/nvidiactl: device node missing"):
        plan_for(make_bundle, discover(str(user)), ["NVIDIA_VISIBLE_DEVICES=all"])


def test_compat32_takes_the_32_bit_entries(make_bundle, inventory, driver_version):
    """compat32 selects the cache's 32-bit entries into the 32-bit lib dir; without it they
    stay out. (Debian ships no i386 build of the 535 driver here, so the 32-bit entry is
    made up: the 64-bit libcuda under i386 flags.)"""
    import msgspec

    from mounts.ldcache import FLAGS_I386

    cuda = next(lib for lib in inventory.libraries if lib.key == "libcuda.so.1")
    lib32 = msgspec.structs.replace(cuda, flags=FLAGS_I386)
    inv = msgspec.structs.replace(inventory, libraries=inventory.libraries + [lib32])
    with32 = plan_for(make_bundle, inv, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,compat32"])
    targets = {a.target for a in by_kind(with32, "library")}
    assert f"/usr/lib/i386-linux-gnu/libcuda.so.{driver_version}" in targets
    (cache,) = by_kind(with32, "ldcache")
    assert any(e.flags == FLAGS_I386 and e.value == "/usr/lib/i386-linux-gnu/libcuda.so.1" for e in cache.entries)
    without = plan_for(make_bundle, inv, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute"])
    assert not any(a.target.startswith("/usr/lib/i386-linux-gnu/") for a in by_kind(without, "library"))
