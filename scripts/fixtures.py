#!/usr/bin/env python3
"""Build (and cache) the test fixtures: driver roots, container root filesystems, bundles.

- ``driver_535()``: Debian's real NVIDIA 535 user-space packages, downloaded with
  ``apt-get download`` through a private apt configuration (its own sources list, state and
  cache dirs: the machine's apt setup is left alone) and unpacked with ``dpkg -x``. Then what
  a real host has after installing them: the alternatives' links, ``etc/ld.so.conf``, an
  ``etc/ld.so.cache`` made by ``ldconfig -r``, ``proc/driver/nvidia`` for two GPUs,
  ``proc/devices`` and device nodes under the root's own ``dev/``.
- ``synthetic_driver(n_libs, n_gpus)``: tiny ELF libraries compiled with gcc, for unit and
  scale tests.
- ``rootfs(style)``: a Debian-like (multiarch) or lib64-style root with the host's glibc,
  busybox and a small ``cudacheck`` program that dlopens ``libcuda.so.1``.
- ``bundle(dest, rootfs, args, env)``: an OCI bundle like ``runc spec`` writes.

Everything is cached under ``$SANDBOX_CACHE`` (default ``<repo>/.cache``). Run as a script it
builds everything and prints the paths.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SANDBOX_CACHE", REPO / ".cache"))
# The version the tests were written against; if Debian's archive no longer carries it (a
# point release replaced it), the newest 535 build there is used instead.
PREFERRED_DEB = "535.261.03-1"
ARCH_DIR = "usr/lib/x86_64-linux-gnu"
NV_DIR = ARCH_DIR + "/nvidia/current"

# Packages that share the driver's version (nvidia-persistenced has its own, from contrib).
DRIVER_DEBS = (
    "libcuda1 libnvidia-ml1 nvidia-smi libnvidia-ptxjitcompiler1 libnvidia-nvvm4 "
    "libcudadebugger1 libnvidia-cfg1 libnvidia-allocator1 libnvidia-pkcs11-openssl3 "
    "firmware-nvidia-gsp nvidia-cuda-mps libnvidia-encode1 libnvcuvid1 libnvidia-opticalflow1 "
    "libnvidia-eglcore libnvidia-glcore libglx-nvidia0 libegl-nvidia0 libgles-nvidia2 "
    "libnvidia-glvkspirv libnvidia-rtcore libnvidia-ngx1 libnvidia-fbc1 "
    "nvidia-vulkan-common nvidia-egl-common nvidia-opencl-common nvidia-opencl-icd "
    "libnvoptix1 xserver-xorg-video-nvidia"
).split()
# Versioned on their own: nvidia-persistenced (contrib), the EGL external platform libraries.
OTHER_DEBS = ["nvidia-persistenced", "libnvidia-egl-wayland1", "libnvidia-egl-gbm1"]
# Debian's loaders, for the tests that run them against the driver's ICD files (with the X
# libraries libGLX_nvidia, the Vulkan ICD, needs).
LOADER_DEBS = ["libvulkan1", "libegl1", "libglvnd0", "libx11-6", "libxext6", "libxcb1", "libxau6",
               "libxdmcp6", "libbsd0", "libmd0"]

# Two GPUs as /proc/driver/nvidia/gpus/<busid>/information shows them.
GPUS = (
    ("0000:3b:00.0", 0, "GPU-4d8f2f4a-6f6c-3b1e-9a1e-0d6f3c2b1a00", "NVIDIA H100 80GB HBM3"),
    ("0000:86:00.0", 1, "GPU-9c1e7b22-51aa-4e0c-8f3d-7e2a9b4c5d11", "NVIDIA H100 80GB HBM3"),
)
UVM_MAJOR, CAPS_MAJOR, IMEX_MAJOR = 508, 511, 507
# A MIG layout on GPU minor 0 (the driver's numbering: config 1, monitor 2, then per GPU 15
# GPU instances of 9 minors each: the GI's access, then its compute instances 0-7):
# GI 1 with CI 0, GI 2 with CIs 0 and 1.
MIG_LAYOUT = {1: (0,), 2: (0, 1)}
DRIVER_REV = 4  # bump when what driver_535() builds (or downloads) changes: the cached root is rebuilt


def run(*cmd: str | os.PathLike, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def say(what: str) -> None:
    """A progress line on stderr (stdout is the fixtures' paths): every step over a second."""
    print(f"fixtures: {what}", file=sys.stderr, flush=True)


def _done(path: Path) -> bool:
    return (path / ".complete").exists()


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _finish(tmp: Path, path: Path) -> Path:
    (tmp / ".complete").touch()
    tmp.rename(path)
    return path


# --- the private apt configuration -------------------------------------------------------


def _os_codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.partition("=")[2].strip().strip('"')
    raise SystemExit("/etc/os-release: no VERSION_CODENAME")


def _machine_sources() -> list[tuple[str, str, str]]:
    """(URI, suite, signed-by) of the machine's own Debian archive entries, from its
    sources.list and sources.list.d (one-line and deb822 formats): the archive's address
    comes from the machine's configuration, never from this repository."""
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    found = []
    for f in files:
        for line in (f.read_text().splitlines() if f.is_file() else []):
            words = line.split("#")[0].split()
            if not words or words[0] != "deb":
                continue
            opts = ""
            if words[1].startswith("["):
                end = next(i for i, w in enumerate(words) if w.endswith("]"))
                opts, words = " ".join(words[1:end + 1]).strip("[]"), [words[0]] + words[end + 1:]
            signed = next((o.partition("=")[2] for o in opts.split() if o.startswith("signed-by=")), "")
            found.append((words[1], words[2], signed))
    for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for para in f.read_text().split("\n\n"):
            fields = {}
            for line in para.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith(("#", " ")):
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        found.append((uri, suite, fields.get("signed-by", "")))
    return found


def apt_options(suite: str | None = None) -> list[str]:
    """apt options that point at a sources list, state and cache of our own: the machine's
    Debian archives (its release and security suites) with every component: the NVIDIA
    packages are in contrib and non-free, egl-wayland and the loaders in main. With
    ``suite`` (another release, such as trixie), that suite of the same archives, main only."""
    base = CACHE / (f"apt-{suite}" if suite else "apt")
    for d in ("state/lists/partial", "cache/archives/partial"):
        (base / d).mkdir(parents=True, exist_ok=True)
    codename = _os_codename()
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    comps = "main" if suite else "main contrib non-free non-free-firmware"
    wanted = (codename,) if suite else (codename, f"{codename}-security")
    lines = sorted({f"deb [signed-by={signed or keyring}] {uri} {suite or s} {comps}\n"
                    for uri, s, signed in _machine_sources() if s in wanted})
    if not any(f" {suite or codename} " in line for line in lines):
        raise SystemExit(f"no Debian {codename} archive in this machine's apt sources (/etc/apt)")
    (base / "sources.list").write_text("".join(lines))
    return [
        f"-oDir::Etc::SourceList={base}/sources.list",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::State={base}/state",
        f"-oDir::Cache={base}/cache",
        "-oDir::State::status=/var/lib/dpkg/status",
        "-oAPT::Sandbox::User=root",
        "-qq",
    ]


def _deb_version(opts: list[str]) -> str:
    """PREFERRED_DEB if the archive still has it, else its newest 535 build of libcuda1."""
    out = subprocess.run(["apt-cache", *opts, "madison", "libcuda1"], capture_output=True, text=True).stdout
    versions = [line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2]
    if PREFERRED_DEB in versions:
        return PREFERRED_DEB
    newest = [v for v in versions if v.startswith("535.")]
    if not newest:
        raise SystemExit(f"no NVIDIA 535 packages (libcuda1) in Debian's archive: {versions}")
    return newest[0]  # madison lists the newest first


def _download(name: str, wanted) -> Path:
    """``.cache/<name>`` with the packages ``wanted(apt options)`` names, downloaded once;
    its .complete holds what ``wanted`` returned second (a version, or nothing)."""
    debs = CACHE / name
    if (debs / ".complete").exists():
        return debs
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    opts = apt_options()
    say(f"apt-get update (a private configuration under {CACHE / 'apt'})")
    run("apt-get", *opts, "update")
    packages, note = wanted(opts)
    t = time.monotonic()
    say(f"downloading {len(packages)} Debian packages into {debs} ...")
    run("apt-get", *opts, "download", *packages, cwd=debs)
    size = sum(f.stat().st_size for f in debs.glob("*.deb"))
    say(f"downloaded {len(packages)} packages, {size / 1e6:.0f} MB, in {time.monotonic() - t:.0f} s")
    (debs / ".complete").write_text(note)
    return debs


def unpacked_debs(root: Path, packages: list[str], suite: str | None = None) -> tuple[Path, Path]:
    """(a fresh directory for ``root``, the .debs in it): ``packages`` of ``suite`` fetched
    through the private apt configuration and unpacked there with dpkg -x (never installed);
    the caller takes what it needs, removes the debs and _finish-es it."""
    tmp = _fresh(root)
    debs = tmp / "debs"
    debs.mkdir()
    opts = apt_options(suite)
    run("apt-get", *opts, "update")
    run("apt-get", *opts, "download", *packages, cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run("dpkg", "-x", deb, tmp)
    return tmp, debs


def download_debs() -> Path:
    def wanted(opts):
        version = _deb_version(opts)
        return [f"{p}={version}" for p in DRIVER_DEBS] + OTHER_DEBS, version + "\n"
    return _download(f"debs-v{DRIVER_REV}", wanted)


# --- the real 535 driver root ------------------------------------------------------------


def driver_535() -> Path:
    root = CACHE / f"driver-535-v{DRIVER_REV}"
    if _done(root):
        return root
    debs = download_debs()
    version = (debs / ".complete").read_text().strip().split("-")[0]  # 535.261.03-1 -> 535.261.03
    tmp = _fresh(root)
    all_debs = sorted(debs.glob("*.deb"))
    for n, deb in enumerate(all_debs, 1):
        if n == 1 or n % 10 == 0 or n == len(all_debs):
            say(f"unpacking with dpkg -x: {n}/{len(all_debs)} ({deb.name})")
        run("dpkg", "-x", deb, tmp)
    # What update-alternatives / nvidia-alternative would have linked on a real host.
    (tmp / "usr/bin").mkdir(parents=True, exist_ok=True)
    (tmp / "usr/bin/nvidia-smi").symlink_to("../lib/nvidia/current/nvidia-smi")
    conf = tmp / "etc/ld.so.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    (tmp / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (conf / "x86_64-linux-gnu.conf").write_text(f"/{ARCH_DIR}\n")
    (conf / "nvidia.conf").write_text(f"/{NV_DIR}\n")
    for link, target in (("usr/share/nvidia/nvoptix.bin", f"/{NV_DIR}/nvoptix.bin"),
                         ("usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib/nvidia/current/nvidia_drv.so"),
                         ("usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
                          "/usr/lib/nvidia/current/libglxserver_nvidia.so")):
        (tmp / link).parent.mkdir(parents=True, exist_ok=True)
        (tmp / link).symlink_to(target)  # absolute, as update-alternatives makes them
    run("ldconfig", "-r", tmp)
    _fake_kernel_side(tmp, version, GPUS, mig=True)
    (tmp / ".version").write_text(version + "\n")
    return _finish(tmp, root)


def driver_version(root: Path) -> str:
    """The version of the driver packages a driver_535() root was built from."""
    return (root / ".version").read_text().strip()


def _fake_kernel_side(root: Path, version: str, gpus, mig: bool = False) -> None:
    """What the kernel module would show: /proc/driver/nvidia, /proc/devices, /dev nodes,
    and what udev makes of the DRM devices (/dev/dri and its by-path links); with ``mig``,
    MIG_LAYOUT on the first GPU."""
    proc = root / "proc/driver/nvidia"
    (proc / "gpus").mkdir(parents=True)
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Jun  5 22:50:47 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
    )
    (proc / "params").write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n")
    (proc / "registry").write_text("Binary: \"\"\n")
    for busid, minor, uuid, model in gpus:
        g = proc / "gpus" / busid
        g.mkdir()
        (g / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\n"
            "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {busid}\nDevice Minor: \t {minor}\n"
            "GPU Excluded:\t No\n"
        )
    (root / "proc/devices").write_text(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n195 nvidia-frontend\n"
        f"{CAPS_MAJOR} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n{IMEX_MAJOR} nvidia-caps-imex-channels\n\n"
        "Block devices:\n  8 sd\n"
    )
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    nodes = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254),
             "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}
    for _busid, minor, _uuid, _model in gpus:
        nodes[f"nvidia{minor}"] = (195, minor)
    nodes.update({f"nvidia-caps-imex-channels/channel{n}": (IMEX_MAJOR, n) for n in (0, 1)})
    (dev / "nvidia-caps-imex-channels").mkdir()
    (dev / "dri/by-path").mkdir(parents=True)
    for i, (busid, _minor, _uuid, _model) in enumerate(gpus):
        for kind, name in (("card", f"card{i + 1}"), ("render", f"renderD{128 + i}")):
            nodes[f"dri/{name}"] = (226, i + 1 if kind == "card" else 128 + i)
            (dev / f"dri/by-path/pci-{busid}-{kind}").symlink_to(f"../{name}")
    if mig:
        nodes.update(_fake_mig(root, gpus[0][1]))
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(dev / name, 0o666)
    (root / "var/run/nvidia-persistenced").mkdir(parents=True, exist_ok=True)


def _fake_mig(root: Path, minor: int) -> dict[str, tuple[int, int]]:
    """The driver's MIG files for MIG_LAYOUT on GPU ``minor``: mig-minors (every possible
    instance, as the driver lists them), an access file per existing instance, and its
    nvidia-caps nodes (what nvidia-modprobe would have made)."""
    def access(rel: str, n: int, mode: int = 0o444) -> None:
        f = root / "proc/driver/nvidia/capabilities" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"DeviceFileMinor: {n}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")

    lines = ["config 1", "monitor 2"]
    for g in range(2):
        for gi in range(15):
            base = 3 + g * 135 + gi * 9
            lines.append(f"gpu{g}/gi{gi}/access {base}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(8)]
    caps = root / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("\n".join(lines) + "\n")
    access("mig/config", 1, 0o400)
    access("mig/monitor", 2)
    nodes = {"nvidia-caps/nvidia-cap1": (CAPS_MAJOR, 1), "nvidia-caps/nvidia-cap2": (CAPS_MAJOR, 2)}
    for gi, cis in MIG_LAYOUT.items():
        base = 3 + minor * 135 + gi * 9
        access(f"gpu{minor}/mig/gi{gi}/access", base)
        nodes[f"nvidia-caps/nvidia-cap{base}"] = (CAPS_MAJOR, base)
        for ci in cis:
            access(f"gpu{minor}/mig/gi{gi}/ci{ci}/access", base + 1 + ci)
            nodes[f"nvidia-caps/nvidia-cap{base + 1 + ci}"] = (CAPS_MAJOR, base + 1 + ci)
    (root / "dev/nvidia-caps").mkdir(parents=True)
    return nodes


# --- the driver where GPU fleets keep it -------------------------------------------------

# (where a fleet's driver root is under the fixture's top directory, which is its device root)
FLEETS = {
    "h200": "",  # a cloud GPU image: /usr/local/nvidia/{lib64,bin,firmware}, a wrapper at /usr/bin/nvidia-smi
    "gke": "home/kubernetes/bin/nvidia",  # GKE's COS nodes: {lib64,bin}, in no ld.so.cache
    "runfile": "",  # NVIDIA's .run installer on a multiarch distribution: /usr/lib/x86_64-linux-gnu, /usr/bin
    "runfile-lib64": "",  # the same on a lib64 distribution: /usr/lib64, /usr/lib64/xorg/modules
    "operator": "run/nvidia/driver",  # the GPU operator's driver container: its root at /run/nvidia/driver
}
FLEET_REV = 1  # bump when what fleet_driver() builds changes
KERNEL_RELEASE = "6.18.44-fc-v1252-gpu"  # the H200 host's (gpu-check), as proc/sys/kernel/osrelease says
SMI_WRAPPER = """#!/bin/bash
# nvidia-smi: the driver lives under /usr/local/nvidia on this image (read-only).
# Put its libraries first so that this nvidia-smi finds its own NVML.
if [ -d /usr/local/nvidia/lib64 ]; then
  export LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The real binary; this script stays in /usr/bin for the image's PATH.
# (it is what the H200 host's /usr/bin/nvidia-smi does)
exec /usr/local/nvidia/bin/nvidia-smi "$@"
"""


def _driver_files(deb_root: Path, version: str) -> tuple[list[Path], dict[str, Path], list[Path]]:
    """The regular files of the unpacked packages a fleet's layout rearranges: the 64-bit
    libraries carrying the version (or NVIDIA's EGL platforms), the binaries by name, the
    GSP firmware."""
    libs = sorted(p for p in (deb_root / ARCH_DIR).rglob("lib*.so.*") if p.is_file() and not p.is_symlink()
                  and (p.name.endswith("." + version) or p.name.startswith("libnvidia-egl-")))
    bins = {"nvidia-smi": deb_root / "usr/lib/nvidia/current/nvidia-smi",
            "nvidia-cuda-mps-control": deb_root / "usr/bin/nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server": deb_root / "usr/sbin/nvidia-cuda-mps-server",
            "nvidia-persistenced": deb_root / "usr/bin/nvidia-persistenced"}
    firmware = sorted((deb_root / f"lib/firmware/nvidia/{version}").glob("gsp*.bin"))
    return libs, bins, firmware


def _place_libraries(libs: list[Path], dest: Path) -> None:
    """Each library hard-linked into ``dest`` with the links an installer makes: its SONAME
    (read from its ELF header) and the development name (libcuda.so -> libcuda.so.1)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from mounts.elf import read_elf

    dest.mkdir(parents=True, exist_ok=True)
    for lib in libs:
        os.link(lib, dest / lib.name)
        soname = read_elf(str(lib)).soname or lib.name
        if soname != lib.name and not (dest / soname).exists():
            (dest / soname).symlink_to(lib.name)
        dev = lib.name[:lib.name.index(".so.") + 3]
        if not (dest / dev).exists():
            (dest / dev).symlink_to(soname)


def _place(files, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        os.link(f, dest / f.name)


def fleet_driver(layout: str) -> tuple[Path, Path]:
    """(driver root, device root) of the real 535 driver laid out as a GPU fleet keeps it
    (FLEETS): driver_535()'s files (Debian's packages unpacked with dpkg -x), hard-linked
    into another layout without Debian's nvidia/current directories and alternatives, with
    the links and ld.so.cache (where the layout has one, by ``ldconfig -r``) an install
    makes, and the kernel's side (/proc, /dev nodes, the kernel's release and, where the
    image sets it, firmware_class's path) under the device root."""
    top = CACHE / f"fleet-{layout}-v{FLEET_REV}"
    driver = top / FLEETS[layout]
    if _done(top):
        return driver, top
    deb = driver_535()
    version = driver_version(deb)
    libs, bins, firmware = _driver_files(deb, version)
    tmp = _fresh(top)
    root = tmp / FLEETS[layout]
    root.mkdir(parents=True, exist_ok=True)
    configs = ["usr/share/vulkan", "usr/share/glvnd", "usr/share/egl", "etc/OpenCL"]
    xorg = [deb / "usr/lib/nvidia/current/nvidia_drv.so", deb / f"usr/lib/nvidia/current/libglxserver_nvidia.so.{version}"]
    if layout == "h200":
        for d in ("bin", "lib", "lib64", "sbin"):  # Ubuntu's merged /usr
            (root / "usr" / d).mkdir(parents=True, exist_ok=True)
            (root / d).symlink_to(f"usr/{d}")
        nv = root / "usr/local/nvidia"
        _place_libraries(libs, nv / "lib64")
        _place(bins.values(), nv / "bin")
        _place(firmware, nv / f"firmware/nvidia/{version}")
        (root / "usr/bin/nvidia-smi").write_text(SMI_WRAPPER)
        (root / "usr/bin/nvidia-smi").chmod(0o755)
        param = tmp / "sys/module/firmware_class/parameters/path"
        param.parent.mkdir(parents=True)
        param.write_text("/usr/local/nvidia/firmware\n")
        conf = "/usr/local/nvidia/lib64\n"
        configs = ["usr/share/vulkan", "usr/share/glvnd"]  # (what the H200 host's CDI spec named)
        xorg = []
    elif layout == "gke":
        _place_libraries(libs, root / "lib64")
        _place(bins.values(), root / "bin")
        _place(firmware, tmp / f"lib/firmware/nvidia/{version}")  # the kernel's, under the device root
        conf = None
        configs, xorg = [], []
    else:  # an installer's, directly in the distribution's directories
        libdir = "usr/lib64" if layout == "runfile-lib64" else ARCH_DIR
        _place_libraries(libs, root / libdir)
        _place([bins["nvidia-smi"], bins["nvidia-cuda-mps-control"], bins["nvidia-persistenced"],
                bins["nvidia-cuda-mps-server"]], root / "usr/bin")
        _place(firmware, root / f"lib/firmware/nvidia/{version}")
        xdir = root / ("usr/lib64" if layout == "runfile-lib64" else "usr/lib") / "xorg/modules"
        _place(xorg[:1], xdir / "drivers")
        _place(xorg[1:], xdir / "extensions")
        conf = f"/{libdir}\n"
    for d in configs:
        shutil.copytree(deb / d, root / d, symlinks=True, copy_function=os.link)
    if conf is not None:
        (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d/driver.conf").write_text(conf)
        run("ldconfig", "-r", root)
    _fake_kernel_side(tmp, version, GPUS)
    (tmp / "proc/sys/kernel").mkdir(parents=True)
    (tmp / "proc/sys/kernel/osrelease").write_text(KERNEL_RELEASE + "\n")
    (tmp / ".version").write_text(version + "\n")
    _finish(tmp, top)
    return driver, top


# --- synthetic driver roots --------------------------------------------------------------


def synthetic_driver(n_libs: int, n_gpus: int = 2, version: str = "999.1.2") -> Path:
    """A driver root of ``n_libs`` tiny libraries named like compute libraries.

    libcuda and libnvidia-ml (selected by the compute and utility filters) head a chain of
    DT_NEEDED edges through ``libnvidia-synthN.so.<version>`` (SONAME ``...so.1``), so the
    closure has to walk all of them.
    """
    root = CACHE / f"synthetic-{n_libs}-{n_gpus}-{version}-v{DRIVER_REV}"
    if _done(root):
        return root
    tmp = _fresh(root)
    libdir = tmp / ARCH_DIR
    libdir.mkdir(parents=True)
    src = tmp / "empty.c"
    src.write_text("int synth_symbol;\n")
    names = ["libcuda", "libnvidia-ml"] + [f"libnvidia-synth{i}" for i in range(n_libs - 2)]
    # compile in reverse so each library can link against the next one (DT_NEEDED)
    for i in reversed(range(n_libs)):
        name = names[i]
        out = libdir / f"{name}.so.{version}"
        cmd = ["gcc", "-shared", "-nostdlib", "-o", out, src, f"-Wl,-soname,{name}.so.1"]
        if i + 1 < n_libs:
            cmd += ["-Wl,--no-as-needed", libdir / f"{names[i + 1]}.so.{version}"]
        run(*cmd)
        (libdir / f"{name}.so.1").symlink_to(out.name)
    src.unlink()
    (tmp / "etc").mkdir()
    (tmp / "etc/ld.so.conf").write_text(f"/{ARCH_DIR}\n")
    run("ldconfig", "-r", tmp)
    gpus = [(f"0000:{0x10 + g:02x}:00.0", g, f"GPU-{g:08x}-0000-0000-0000-000000000000", "NVIDIA Synthetic")
            for g in range(n_gpus)]
    _fake_kernel_side(tmp, version, gpus)
    return _finish(tmp, root)


# --- container root filesystems ----------------------------------------------------------

BUSYBOX_APPLETS = ("sh ls cat echo true false sleep readlink stat id hostname test env mount grep wc "
                   "mknod umount touch kill cut mkdir rm printf ps head tty").split()
ROOTFS_REV = 3  # bump when what rootfs() builds changes: the cached roots are rebuilt
GLIBC = ("ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1").split()
CUDACHECK = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    const char *lib = argc > 1 ? argv[1] : "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    void *sym = dlsym(h, "cuInit");
    if (!sym) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 3; }
    printf("%s: cuInit found\n", lib);
    return 0;
}
"""


def rootfs(style: str = "debian") -> Path:
    """A small container root: glibc from the host, busybox, cudacheck. style: debian|lib64."""
    assert style in ("debian", "lib64")
    root = CACHE / f"rootfs-{style}-v{ROOTFS_REV}"
    if _done(root):
        return root
    tmp = _fresh(root)
    libdir = "usr/lib/x86_64-linux-gnu" if style == "debian" else "usr/lib64"
    for d in ("usr/bin", libdir, "etc", "dev", "proc", "sys", "tmp", "root", "lib64"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "bin").symlink_to("usr/bin")
    if style == "debian":
        (tmp / "lib").symlink_to("usr/lib")
        (tmp / "etc/debian_version").write_text("12.8\n")
        (tmp / "lib64/ld-linux-x86-64.so.2").symlink_to("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    else:
        (tmp / "lib64").rmdir()
        (tmp / "lib64").symlink_to("usr/lib64")
    for lib in GLIBC:
        shutil.copy2(Path("/lib/x86_64-linux-gnu") / lib, tmp / libdir / lib)
    shutil.copy2("/bin/busybox", tmp / "usr/bin/busybox")
    for applet in BUSYBOX_APPLETS:
        (tmp / "usr/bin" / applet).symlink_to("busybox")
    src = tmp / "cudacheck.c"
    src.write_text(CUDACHECK)
    run("gcc", "-O1", "-o", tmp / "usr/bin/cudacheck", src, "-ldl")
    src.unlink()
    (tmp / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    (tmp / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (tmp / "etc/ld.so.conf").write_text(f"/{libdir}\n")
    run("ldconfig", "-r", tmp)
    tmp.chmod(0o755)
    return _finish(tmp, root)


LOADERCHECK = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
/* Vulkan's and EGL's entry points, declared here: no -dev package in the build. */
typedef struct {
    int sType; const void *pNext; uint32_t flags; const void *pApplicationInfo;
    uint32_t enabledLayerCount; const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount; const char *const *ppEnabledExtensionNames;
} VkInstanceCreateInfo;
typedef int (*vkCreateInstance_t)(const VkInstanceCreateInfo *, const void *, void **);
typedef const char *(*eglQueryString_t)(void *, int);

static void *open_or_die(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); }
    return h;
}

static void mapped(const char *what) {  /* the vendor libraries the loader brought in */
    char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/');
        if (p && strstr(p, what) && strstr(line, "r-xp")) { printf("mapped %s", p); }
    }
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "vulkan")) {
        void *h = open_or_die("libvulkan.so.1");
        if (!h) return 2;
        vkCreateInstance_t create = (vkCreateInstance_t)dlsym(h, "vkCreateInstance");
        VkInstanceCreateInfo ci;
        memset(&ci, 0, sizeof ci);
        ci.sType = 1;  /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO */
        void *instance = 0;
        int rc = create(&ci, 0, &instance);
        mapped("nvidia");
        printf("vkCreateInstance: %d\n", rc);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "egl")) {
        void *h = open_or_die("libEGL.so.1");
        if (!h) return 2;
        eglQueryString_t query = (eglQueryString_t)dlsym(h, "eglQueryString");
        const char *ext = query(0, 0x3055);  /* EGL_NO_DISPLAY, EGL_EXTENSIONS: every vendor's */
        printf("client extensions: %s\n", ext ? ext : "(none)");
        mapped("nvidia");
        return 0;
    }
    fprintf(stderr, "usage: loadercheck vulkan|egl\n");
    return 2;
}
"""


def loader_debs() -> Path:
    return _download("loader-debs-v1", lambda opts: (LOADER_DEBS, ""))


def loaders_rootfs() -> Path:
    """rootfs("debian") plus Debian's Vulkan and EGL loaders (libvulkan1, libegl1 and what
    they and the driver's ICDs need of the system's), and loadercheck, which drives them."""
    root = CACHE / f"rootfs-loaders-v{ROOTFS_REV}"
    if _done(root):
        return root
    debs = loader_debs()
    tmp = _fresh(root)
    shutil.rmtree(tmp)
    shutil.copytree(rootfs("debian"), tmp, symlinks=True)
    for deb in sorted(debs.glob("*.deb")):
        run("dpkg", "-x", deb, tmp)
    src = tmp / "loadercheck.c"
    src.write_text(LOADERCHECK)
    run("gcc", "-O1", "-o", tmp / "usr/bin/loadercheck", src, "-ldl")
    src.unlink()
    run("ldconfig", "-r", tmp)
    return _finish(tmp, root)


FAT_LIBS = 1400  # the "image with 1400 libraries"


def fat_rootfs() -> Path:
    """rootfs("debian") with an ld.so.cache of FAT_LIBS entries, each naming a library file
    there (hard links of one small shared library, a SONAME of its own in the cache): the
    ld.so.cache a GPU container's is built from, at a large image's size."""
    root = CACHE / f"rootfs-fat-v{ROOTFS_REV}"
    if _done(root):
        return root
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from mounts import ldcache

    tmp = _fresh(root)
    shutil.rmtree(tmp)
    shutil.copytree(rootfs("debian"), tmp, symlinks=True)
    libdir = tmp / "usr/lib/x86_64-linux-gnu"
    src = tmp / "bench.c"
    src.write_text("int bench(void) { return 1; }\n")
    run("gcc", "-shared", "-fPIC", "-O1", "-o", libdir / "libbench.so", src)
    src.unlink()
    entries = ldcache.read(str(tmp / "etc/ld.so.cache"))
    for i in range(FAT_LIBS - len(entries)):
        name = f"libbench{i}.so.{i % 7}"
        os.link(libdir / "libbench.so", libdir / name)
        entries.append(ldcache.Entry(name, f"/usr/lib/x86_64-linux-gnu/{name}"))
    (libdir / "libbench.so").unlink()
    (tmp / "etc/ld.so.cache").write_bytes(ldcache.build(entries))
    return _finish(tmp, root)


# --- bundles -----------------------------------------------------------------------------


def default_spec(args: list[str], env: list[str] | None = None, rootfs_path: str = "rootfs") -> dict:
    """A config.json shaped like the one ``runc spec`` writes (terminal off)."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "TERM=xterm"] + list(env or []),
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs_path, "readonly": True},
        "hostname": "runc",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                            "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                            "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        },
    }


def bundle(dest: Path, root: Path, args: list[str], env: list[str] | None = None, **spec_updates) -> Path:
    """Write an OCI bundle at ``dest`` whose root.path is the absolute path of ``root`` (a
    shared, never-copied rootfs; runc refuses a rootfs reached through a symlink)."""
    dest.mkdir(parents=True, exist_ok=True)
    spec = default_spec(args, env, str(root))
    spec.update(spec_updates)
    (dest / "config.json").write_text(json.dumps(spec, indent=2))
    return dest


PODMAN_PROFILE = "/usr/share/containers/seccomp.json"


def engine_seccomp_profile(caps: tuple[str, ...] = ()) -> dict:
    """podman's default profile (Docker's, in origin) resolved as the engine resolves it for
    a container with ``caps`` on x86-64: the template's includes/excludes applied, then gone."""
    with open(PODMAN_PROFILE) as f:
        profile = json.load(f)
    resolved = []
    for rule in profile["syscalls"]:
        inc, exc = rule.pop("includes", None) or {}, rule.pop("excludes", None) or {}
        wanted = all(c in caps for c in inc.get("caps", [])) and (not inc.get("arches") or "amd64" in inc["arches"])
        unwanted = any(c in caps for c in exc.get("caps", [])) or "amd64" in exc.get("arches", [])
        if wanted and not unwanted:
            resolved.append(rule)
    profile["syscalls"] = resolved
    profile.setdefault("architectures", ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
    return profile


def demo_bundle() -> Path:
    return bundle(
        CACHE / "bundles/demo",
        rootfs("debian"),
        ["sh", "-c", "ls -l /dev/nvidia*; cudacheck; nvidia-smi; echo \"nvidia-smi exited $?\""],
        ["NVIDIA_VISIBLE_DEVICES=all"],
    )


IMAGE = "localhost/gpubox:latest"
FAT_IMAGE = "localhost/gpubox-fat:latest"  # fat_rootfs()'s


def image_archive(fat: bool = False) -> Path:
    """The Debian-style rootfs (fat: fat_rootfs()) as a docker-archive tar (manifest.json,
    config, one layer): what `podman load`, `ctr images import` and `docker load` all read,
    with no registry."""
    import hashlib
    import tarfile

    out = CACHE / f"gpubox{'-fat' if fat else ''}-v{ROOTFS_REV}.tar"
    if out.exists():
        return out
    root = fat_rootfs() if fat else rootfs("debian")
    tmp = CACHE / "image.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    layer = tmp / "layer.tar"
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
        for path in sorted(root.rglob("*")):
            if path.name != ".complete":
                t.add(path, arcname=str(path.relative_to(root)), recursive=False)
    digest = hashlib.sha256(layer.read_bytes()).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    (tmp / config_name).write_bytes(config)
    (tmp / digest).mkdir()
    layer.rename(tmp / digest / "layer.tar")
    (tmp / "manifest.json").write_text(json.dumps(
        [{"Config": config_name, "RepoTags": [FAT_IMAGE if fat else IMAGE], "Layers": [f"{digest}/layer.tar"]}]))
    partial = out.with_suffix(".partial.tar")
    with tarfile.open(partial, "w") as t:
        for name in ("manifest.json", config_name, f"{digest}/layer.tar"):
            t.add(tmp / name, arcname=name)
    partial.rename(out)
    shutil.rmtree(tmp)
    return out


def compile_project() -> None:
    """Write the .pyc files PYTHONDONTWRITEBYTECODE would leave unwritten (as scripts/setup
    does): benchmarks must not time the compiling of our own modules."""
    run(REPO / ".venv/bin/python", "-m", "compileall", "-q", "sandbox", "gofer", "mounts",
        cwd=REPO, stdout=subprocess.DEVNULL)


def main() -> int:
    paths = {
        "driver": driver_535(),
        "rootfs-debian": rootfs("debian"),
        "rootfs-lib64": rootfs("lib64"),
        "demo": demo_bundle(),
        "image": image_archive(),
    }
    for name, path in paths.items():  # shell assignments: eval "$(scripts/fixtures.py)"
        print(f"{name.replace('-', '_')}={shlex.quote(str(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
