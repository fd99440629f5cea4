"""Discovery where GPU fleets keep the driver (fixtures.FLEETS: the real 535 packages laid out
as a cloud GPU image, a GKE node, NVIDIA's installer on a multiarch or lib64 distribution and
the GPU operator's driver container lay them), and the candidates it must pass over."""

import os
import shutil
import subprocess

import fixtures
import msgspec
import pytest

from mounts.bundle import load_bundle
from mounts.driver import discover
from mounts.errors import DriverError
from mounts.layout import layout_of
from mounts.plan import compute_plan
from mounts.request import gpu_request
from tests.integration.helpers import sandbox

VERSION = "535.261.03"  # (driver_535()'s; checked below against the fixture's)
# Where each layout keeps the binaries and the firmware, as its fleet does (paths in the driver root)
BIN_DIR = {"h200": "/usr/local/nvidia/bin", "gke": "/bin", "runfile": "/usr/bin", "runfile-lib64": "/usr/bin",
           "operator": "/usr/bin"}
FIRMWARE_DIR = {"h200": "/usr/local/nvidia/firmware/nvidia/{v}", "gke": "/lib/firmware/nvidia/{v}"}
# What nvidia-ctk (v1.18, through the real NVML) bound on the H200 cloud image, from its spec in
# ../shared/gpu-check/h200-2026-12-04/cdi-nvctk.yaml: libraries by name less their version,
# binaries, firmware by file name.
NVCTK_H200_LIBS = {
    "libEGL_nvidia.so", "libGLESv1_CM_nvidia.so", "libGLESv2_nvidia.so", "libGLX_nvidia.so", "libcuda.so",
    "libcudadebugger.so", "libnvcuvid.so", "libnvidia-allocator.so", "libnvidia-cfg.so", "libnvidia-eglcore.so",
    "libnvidia-encode.so", "libnvidia-fbc.so", "libnvidia-glcore.so", "libnvidia-glsi.so", "libnvidia-glvkspirv.so",
    "libnvidia-gpucomp.so", "libnvidia-ml.so", "libnvidia-nvvm.so", "libnvidia-opencl.so", "libnvidia-opticalflow.so",
    "libnvidia-pkcs11-openssl3.so", "libnvidia-ptxjitcompiler.so", "libnvidia-rtcore.so", "libnvidia-tls.so",
    "libnvoptix.so", "libvdpau_nvidia.so"}
NVCTK_H200_BINS = {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-debugdump", "nvidia-persistenced",
                   "nvidia-smi"}
NVCTK_H200_FIRMWARE = {"gsp_ga10x.bin", "gsp_tu10x.bin"}


def fleet(layout):
    driver, dev = fixtures.fleet_driver(layout)
    return str(driver), str(dev)


def plan(make_bundle, inventory, caps="compute,utility"):
    bundle = load_bundle(str(make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_DRIVER_CAPABILITIES={caps}"])))
    return compute_plan(gpu_request(bundle.spec), inventory, layout_of(bundle.rootfs))


def copy(tmp_path, layout):
    """A copy of a fleet's fixture to change (hard links: a file is replaced, never written through)."""
    driver, dev = fixtures.fleet_driver(layout)
    top = tmp_path / "fleet"
    subprocess.run(["cp", "-al", str(dev), str(top)], check=True)
    return top / driver.relative_to(dev), top


def replace(path, data: bytes | None = None, mode=0o755):
    path.unlink()
    if data is not None:
        path.write_bytes(data)
        path.chmod(mode)


@pytest.mark.parametrize("layout", list(fixtures.FLEETS))
def test_each_fleets_layout_gives_the_debian_drivers_files(layout, make_bundle, driver_root, driver_version):
    """The same libraries (by SONAME) as the Debian layout, the driver's own ELF binaries at
    /usr/bin in the container, the GSP firmware, whatever the layout."""
    assert driver_version == VERSION
    root, dev = fleet(layout)
    inv = discover(root, dev)
    debian = discover(str(driver_root))
    sonames = {(lib.soname, lib.flags) for lib in debian.libraries}
    assert inv.version == VERSION and len(inv.gpus) == 2
    assert {(lib.soname, lib.flags) for lib in inv.libraries} == sonames
    assert all(lib.path.startswith(root + "/") and lib.broken is None for lib in inv.libraries)
    assert inv.libraries_from == ("search of /lib64" if layout == "gke" else "etc/ld.so.cache")
    assert set(inv.binaries) == {"nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced"}
    for name, path in inv.binaries.items():
        assert path == f"{root}{BIN_DIR[layout]}/{name}"
        with open(path, "rb") as f:
            assert f.read(4) == b"\x7fELF", path
    firmware = FIRMWARE_DIR.get(layout, "/lib/firmware/nvidia/{v}").format(v=VERSION)
    base = dev if layout == "gke" else root  # GKE's is the kernel's, under the device root
    assert inv.firmware == {f"{firmware}/{n}": f"{base}{firmware}/{n}" for n in NVCTK_H200_FIRMWARE}
    assert inv.refused == {}
    p = plan(make_bundle, inv, "all")
    binaries = {a.target: a.source for a in p.actions if a.kind == "binary"}
    assert binaries == {f"/usr/bin/{n}": path for n, path in inv.binaries.items()}
    assert {a.target for a in p.actions if a.kind == "firmware"} == set(inv.firmware)
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= {e.key for a in p.actions if a.kind == "ldcache" for e in a.entries}


def test_the_h200_images_wrapper_is_passed_over_and_said_with_debug(make_bundle, tmp_path):
    """/usr/bin/nvidia-smi there is a script that execs /usr/local/nvidia/bin/nvidia-smi:
    bound, it fails in every container (127). The binary beside the libraries is taken; the
    wrapper is named under --debug, never an error."""
    root, dev = fleet("h200")
    inv = discover(root)
    assert inv.binaries["nvidia-smi"] == f"{root}/usr/local/nvidia/bin/nvidia-smi"
    assert inv.notes == (f"nvidia-smi: took {root}/usr/local/nvidia/bin/nvidia-smi, passed over "
                         f"{root}/usr/bin/nvidia-smi: a script (#!/bin/bash)",)
    bundle = make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all"])
    quiet, debug = sandbox("plan", bundle, "--driver-root", root), sandbox("--debug", "plan", bundle, "--driver-root", root)
    assert quiet.returncode == debug.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert debug.stderr == f"sandbox plan: debug: {inv.notes[0]}\n" and debug.stdout == quiet.stdout
    rows = [line.split() for line in quiet.stdout.splitlines()]
    assert ["binary", "/usr/bin/nvidia-smi", f"{root}/usr/local/nvidia/bin/nvidia-smi", "ro,nosuid,nodev"] in rows
    assert ["firmware", f"/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
            f"{root}/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_ga10x.bin", "ro,nosuid,nodev"] in rows


def test_the_plan_names_what_nvidia_ctk_named_on_the_h200(make_bundle):
    """Every library, binary and firmware file nvidia-ctk bound on the real H200 that the 535
    packages have (they lack GLESv1_CM, gpucomp, vdpau and debugdump) is planned, and nothing
    of the driver's that it left out, but for what our capabilities add (ngx; the EGL
    platforms, which that host lacks)."""
    root, _dev = fleet("h200")
    inv = discover(root)
    p = plan(make_bundle, inv, "all")
    libs = {os.path.basename(a.source).removesuffix("." + VERSION) for a in p.actions if a.kind == "library"}
    have = {lib.name.removesuffix("." + VERSION) for lib in inv.libraries}
    assert libs & NVCTK_H200_LIBS == have & NVCTK_H200_LIBS
    assert libs - NVCTK_H200_LIBS == {"libnvidia-ngx.so", "libnvidia-egl-wayland.so.1.1.10", "libnvidia-egl-gbm.so.1.1.0"}
    assert {os.path.basename(a.target) for a in p.actions if a.kind == "binary"} == NVCTK_H200_BINS - {"nvidia-debugdump"}
    assert {os.path.basename(a.target) for a in p.actions if a.kind == "firmware"} == NVCTK_H200_FIRMWARE


def test_gke_without_a_cache_is_found_by_searching_and_said_in_the_plan(make_bundle):
    root, dev = fleet("gke")
    r = sandbox("plan", make_bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "--driver-root", root, "--dev-root", dev)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (f"driver {VERSION} (CUDA 12.2) at {root}; libraries by search of /lib64 "
                                        "(no ld.so.cache entry); GPUs: 0:0000:3b:00.0")
    assert ["library", f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}", f"{root}/lib64/libcuda.so.{VERSION}",
            "ro,nosuid,nodev"] in [line.split() for line in r.stdout.splitlines()]


def test_a_wrapper_alone_is_an_error_for_a_container_that_wants_it(tmp_path, make_bundle):
    """The real binary gone (a FIFO in its place, never opened: no hang): only the wrapper
    is left, which would fail in the container. A utility container is refused in one line
    naming both; a compute-only one goes on."""
    root, _dev = copy(tmp_path, "h200")
    smi = root / "usr/local/nvidia/bin/nvidia-smi"
    replace(smi)
    os.mkfifo(smi)
    inv = discover(str(root))
    assert "nvidia-smi" not in inv.binaries
    assert inv.refused["nvidia-smi"] == f"{root}/usr/local/nvidia/bin/nvidia-smi: a FIFO; " \
                                        f"{root}/usr/bin/nvidia-smi: a script (#!/bin/bash)"
    with pytest.raises(DriverError, match=r"^nvidia-smi: no ELF executable of the driver's found, only .*: a FIFO; "
                                          r".*/usr/bin/nvidia-smi: a script \(#!/bin/bash\): point --driver-root"):
        plan(make_bundle, inv, "utility")
    assert [a for a in plan(make_bundle, inv, "compute").actions if a.kind == "binary"]  # the MPS binaries


@pytest.mark.parametrize("kind", ["absolute-link", "climbing-link", "not-executable", "library", "directory"])
def test_candidates_that_are_not_the_drivers_binary(kind, tmp_path):
    """Each is passed over (noted), and the wrapper with it: nothing is found. A link is
    resolved inside the driver root ("/" and ".." stop at it): never the host's file."""
    root, _dev = copy(tmp_path, "h200")
    smi = root / "usr/local/nvidia/bin/nvidia-smi"
    real = smi.read_bytes()
    replace(smi)
    if kind == "absolute-link":
        smi.symlink_to("/usr/bin/true")  # the host's is an ELF executable; the root has none
    elif kind == "climbing-link":
        smi.symlink_to("../" * 20 + "usr/bin/true")
    elif kind == "not-executable":
        smi.write_bytes(real)
        smi.chmod(0o644)
    elif kind == "library":
        shutil.copy(root / f"usr/local/nvidia/lib64/libnvidia-allocator.so.{VERSION}", smi)
        smi.chmod(0o755)
    else:
        smi.mkdir()
    inv = discover(str(root))
    assert "nvidia-smi" not in inv.binaries
    why = {"absolute-link": None, "climbing-link": None, "not-executable": "not executable",
           "library": "an ELF shared library, not an executable", "directory": "a directory"}[kind]
    if why is None:
        assert inv.refused["nvidia-smi"] == f"{root}/usr/bin/nvidia-smi: a script (#!/bin/bash)"
        assert f"nvidia-smi: passed over {smi}: a symlink that leads to no file inside the driver root" in inv.notes
    else:
        assert inv.refused["nvidia-smi"].startswith(f"{smi}: {why}; ")


def test_of_two_elf_binaries_the_drivers_version_wins(tmp_path):
    """An ELF nvidia-smi of another build first in the search (beside the libraries) and the
    driver's own in /usr/bin: the one whose bytes carry the driver's version is taken."""
    root, _dev = copy(tmp_path, "h200")
    smi = root / "usr/local/nvidia/bin/nvidia-smi"
    usr = root / "usr/bin/nvidia-smi"
    replace(usr)
    os.link(smi, usr)
    replace(smi, (root / "usr/local/nvidia/bin/nvidia-persistenced").read_bytes())  # an ELF of 535.171.04
    inv = discover(str(root))
    assert inv.binaries["nvidia-smi"] == str(usr)
    assert f"nvidia-smi: took {usr}, passed over {smi}" in inv.notes
    # one file under two names is one candidate
    replace(smi)
    os.link(usr, smi)
    inv = discover(str(root))
    assert inv.binaries["nvidia-smi"] == str(smi) and inv.notes == ()


def test_a_hosts_path_is_searched_inside_the_root(tmp_path):
    """search_path (the host's PATH, for the root /) names directories inside the root."""
    root, dev = copy(tmp_path, "gke")
    opt = root / "opt/nv/bin"
    opt.mkdir(parents=True)
    (root / "bin/nvidia-smi").rename(opt / "nvidia-smi")
    assert "nvidia-smi" not in discover(str(root), str(dev)).binaries
    inv = discover(str(root), str(dev), search_path="relative/ignored:/opt/nv/bin")
    assert inv.binaries["nvidia-smi"] == str(opt / "nvidia-smi")


def _firmware_root(tmp_path):
    """A driver root of the real 535 libraries (GKE's layout) whose GSP files can be put
    anywhere: returns (root, one firmware file to link from)."""
    root, dev = copy(tmp_path, "gke")
    fw = dev / f"lib/firmware/nvidia/{VERSION}"
    src = tmp_path / "gsp"
    shutil.move(str(fw), str(src))
    return root, dev, src


def test_firmware_where_the_kernel_looks_in_its_order(tmp_path):
    """firmware_class's path first, then updates/<release>, updates, <release>, lib/firmware,
    each file from the first that has it; the release from the device root's procfs."""
    root, dev, src = _firmware_root(tmp_path)
    release = fixtures.KERNEL_RELEASE
    places = {"param": "/opt/fw", "updates-release": f"/lib/firmware/updates/{release}",
              "updates": "/lib/firmware/updates", "release": f"/lib/firmware/{release}", "plain": "/lib/firmware"}
    for d in places.values():
        (dev / d.lstrip("/") / f"nvidia/{VERSION}").mkdir(parents=True)
    def put(place, name):
        os.link(src / name, dev / places[place].lstrip("/") / f"nvidia/{VERSION}" / name)
    put("plain", "gsp_tu10x.bin")
    put("release", "gsp_tu10x.bin")
    put("release", "gsp_ga10x.bin")
    put("updates", "gsp_ga10x.bin")
    def found():
        return {t: h.removeprefix(str(dev)) for t, h in discover(str(root), str(dev)).firmware.items()}
    fw = f"nvidia/{VERSION}"
    assert found() == {f"/lib/firmware/updates/{fw}/gsp_ga10x.bin": f"/lib/firmware/updates/{fw}/gsp_ga10x.bin",
                       f"/lib/firmware/{release}/{fw}/gsp_tu10x.bin": f"/lib/firmware/{release}/{fw}/gsp_tu10x.bin"}
    put("updates-release", "gsp_tu10x.bin")
    put("param", "gsp_ga10x.bin")
    param = dev / "sys/module/firmware_class/parameters/path"
    param.parent.mkdir(parents=True)
    param.write_text("/opt/fw\n")
    assert found() == {f"/opt/fw/{fw}/gsp_ga10x.bin": f"/opt/fw/{fw}/gsp_ga10x.bin",
                       f"/lib/firmware/updates/{release}/{fw}/gsp_tu10x.bin":
                           f"/lib/firmware/updates/{release}/{fw}/gsp_tu10x.bin"}
    # another kernel: its release's directories are not this one's; an empty parameter is none
    replace(dev / "proc/sys/kernel/osrelease", b"6.1.0-99-amd64\n", 0o444)
    param.write_text("\n")
    assert found() == {f"/lib/firmware/updates/{fw}/gsp_ga10x.bin": f"/lib/firmware/updates/{fw}/gsp_ga10x.bin",
                       f"/lib/firmware/{fw}/gsp_tu10x.bin": f"/lib/firmware/{fw}/gsp_tu10x.bin"}


def test_firmware_links_stay_inside_the_root_and_a_fifo_is_passed_over(tmp_path):
    root, dev, src = _firmware_root(tmp_path)
    param = dev / "sys/module/firmware_class/parameters/path"
    param.parent.mkdir(parents=True)
    param.write_text("/fw\n")
    (dev / "fw").symlink_to("../" * 30 + "lib/firmware")  # climbs to the device root's /lib/firmware
    fw = dev / f"lib/firmware/nvidia/{VERSION}"
    fw.mkdir(parents=True)
    os.mkfifo(fw / "gsp_ga10x.bin")
    (fw / "gsp_tu10x.bin").symlink_to("/gsp_tu10x.bin")  # the device root's, not the host's
    os.link(src / "gsp_tu10x.bin", dev / "gsp_tu10x.bin")
    inv = discover(str(root), str(dev))
    assert inv.firmware == {f"/fw/nvidia/{VERSION}/gsp_tu10x.bin": f"{dev}/gsp_tu10x.bin"}
    assert inv.notes == (f"firmware: passed over {dev}/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin: a FIFO",)
    param.write_text("/etc/passwd\n")  # not a directory: nothing there
    assert discover(str(root), str(dev)).firmware == {f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin":
                                                      f"{dev}/gsp_tu10x.bin"}


def test_the_search_reads_ld_so_conf_and_takes_sonames_from_the_elf(tmp_path):
    """No cache, the libraries in a directory only ld.so.conf names (through an include): found
    there, keyed by their SONAMEs (no SONAME link needed), as ldconfig would list them."""
    root, dev = copy(tmp_path, "gke")
    (root / "lib64").rename(root / "drv")
    for link in (root / "drv").iterdir():
        if link.is_symlink():
            link.unlink()
    with pytest.raises(DriverError, match=r"no etc/ld.so.cache, no libcuda.so.<version> or libnvidia-ml.so.<version> "
                                          r"in its library directories \(it has none\)"):
        discover(str(root))  # (no kernel side either: nothing says which driver)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("# the loader's\ninclude ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nv.conf").write_text("/drv\n")
    inv = discover(str(root), str(dev))
    assert inv.libraries_from == "search of /drv"
    cuda = next(lib for lib in inv.libraries if lib.key == "libcuda.so.1")
    assert cuda.path == f"{root}/drv/libcuda.so.{VERSION}" and cuda.flags == 0x0303 and cuda.soname == "libcuda.so.1"
    assert {lib.key for lib in inv.libraries} >= {"libnvidia-ml.so.1", "libnvidia-egl-wayland.so.1",
                                                  f"libnvidia-glcore.so.{VERSION}"}


def test_the_search_never_reads_a_fifo_and_a_cache_without_the_driver_is_searched_too(tmp_path):
    root, dev = copy(tmp_path, "gke")
    (root / "etc").mkdir()
    shutil.copy("/etc/ld.so.cache", root / "etc/ld.so.cache")  # the host's: no NVIDIA driver in it
    inv = discover(str(root), str(dev))
    assert inv.libraries_from == "search of /lib64" and any(lib.key == "libcuda.so.1" for lib in inv.libraries)
    lib = root / f"lib64/libnvidia-ptxjitcompiler.so.{VERSION}"
    replace(lib)
    os.mkfifo(lib)
    with pytest.raises(DriverError, match=f"^{lib}: library libnvidia-ptxjitcompiler.so.{VERSION} of the driver "
                                          "is not a regular file$"):
        discover(str(root), str(dev))


def test_xorg_modules_of_debians_flavour_packages(tmp_path, driver_root, driver_copy, make_bundle):
    """Debian's tesla flavours keep the modules in /usr/lib/nvidia/<flavour>/: the one whose
    GLX module is of this driver is taken (another flavour's, of another version, never),
    bound where Xorg looks."""
    user = driver_copy
    nv = user / "usr/lib/nvidia"
    for link in (user / "usr/lib/xorg/modules/drivers/nvidia_drv.so",
                 user / "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"):
        link.unlink()  # no alternatives: a flavour package alone
    (nv / "current").rename(nv / "tesla-535")
    old = nv / "tesla-470"
    old.mkdir()
    os.link(nv / "tesla-535/nvidia_drv.so", old / "nvidia_drv.so")
    os.link(nv / f"tesla-535/libglxserver_nvidia.so.{VERSION}", old / "libglxserver_nvidia.so.470.256.02")
    inv = discover(str(user))
    ext = "/usr/lib/xorg/modules/extensions"
    assert inv.xorg == {"/usr/lib/xorg/modules/drivers/nvidia_drv.so": f"{nv}/tesla-535/nvidia_drv.so",
                        f"{ext}/libglxserver_nvidia.so.{VERSION}": f"{nv}/tesla-535/libglxserver_nvidia.so.{VERSION}"}
    p = plan(make_bundle, inv, "display")
    assert {a.target: a.source for a in p.actions if a.kind == "library" and "/xorg/" in a.target} == inv.xorg
    (nv / "tesla-535").rename(nv / "tesla")
    assert set(discover(str(user)).xorg.values()) == {f"{nv}/tesla/nvidia_drv.so",
                                                      f"{nv}/tesla/libglxserver_nvidia.so.{VERSION}"}


def test_plan_json_says_where_libraries_came_from_and_the_notes(make_bundle):
    root, dev = fleet("h200")
    r = sandbox("plan", make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all"]), "--driver-root", root, "--json")
    assert r.returncode == 0, r.stderr
    doc = msgspec.json.decode(r.stdout)
    assert doc["driver"]["libraries_from"] == "etc/ld.so.cache"
    assert doc["notes"] == [f"nvidia-smi: took {root}/usr/local/nvidia/bin/nvidia-smi, passed over "
                            f"{root}/usr/bin/nvidia-smi: a script (#!/bin/bash)"]
