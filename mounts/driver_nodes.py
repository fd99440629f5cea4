"""The kernel side of driver discovery, under the device root: the GPUs /proc lists, the
majors of /proc/devices, the device nodes (control, UVM, modeset, per GPU, IMEX channels),
the DRI nodes of each GPU, and the MIG instances with their capability minors."""

from __future__ import annotations

import os
import re
import stat

from mounts import reads
from mounts.driver_facts import DeviceNode, Gpu, Mig, in_root, lstat_or_none, read_text
from mounts.errors import DriverError
from mounts.paths import Resolver

CTL_MINOR, MODESET_MINOR = 255, 254
NVIDIA_MAJOR = 195
DRM_MAJOR = 226  # /dev/dri/card<N> (minor N) and renderD<N> (minor N)
_NUMBER = re.compile(r"[0-9]{1,9}")
_BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def gpus(kernel: Resolver) -> list[Gpu]:
    base = in_root(kernel, "proc/driver/nvidia/gpus")
    if base is None:
        return []
    try:
        busids = sorted(reads.listdir(base))
    except OSError:
        return []
    gpus = []
    for index, busid in enumerate(busids):
        info_path = os.path.join(base, busid, "information")
        if not _BUS_ID.fullmatch(busid):  # it becomes a path in the container and on the host
            raise DriverError(f"{base}/{busid}: not a PCI bus id (domain:bus:device.function)")
        info = {}
        for line in (read_text(kernel, f"proc/driver/nvidia/gpus/{busid}/information") or "").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        if not _NUMBER.fullmatch(info.get("Device Minor", "")):
            raise DriverError(f"{info_path}: no valid 'Device Minor:' line")
        minor = int(info["Device Minor"])
        location = info.get("Bus Location", busid).lower()
        if location != busid.lower():
            raise DriverError(f"{info_path}: 'Bus Location: {location[:40]}' is not its directory's bus id {busid}")
        gpus.append(Gpu(index, minor, info.get("GPU UUID", ""), busid.lower(), info.get("Model", "")))
    return gpus


def majors(kernel: Resolver) -> dict[str, int]:
    majors = {}
    for line in (read_text(kernel, "proc/devices") or "").splitlines():
        if line.startswith("Block"):
            break
        num, _, name = line.strip().partition(" ")
        if _NUMBER.fullmatch(num):
            majors[name.strip()] = int(num)
    return majors


IMEX_DIR = "nvidia-caps-imex-channels"  # /dev/<this>/channel<N>, the major of the same name in /proc/devices
IMEX_MAJOR_NAME = "nvidia-caps-imex-channels"


def devices(root: str, gpus: list[Gpu], majors: dict[str, int]) -> dict[str, DeviceNode]:
    """Every NVIDIA node present under ``root``/dev, each checked to be the char device it
    should be (a regular file or a wrong number under that name is an error, not a skip)."""
    wanted = {"nvidiactl": (NVIDIA_MAJOR, CTL_MINOR), "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR)}
    wanted.update({f"nvidia{g.minor}": (NVIDIA_MAJOR, g.minor) for g in gpus})
    if "nvidia-uvm" in majors:
        wanted["nvidia-uvm"] = (majors["nvidia-uvm"], 0)
        wanted["nvidia-uvm-tools"] = (majors["nvidia-uvm"], 1)
    caps_dir = os.path.join(root, "dev/nvidia-caps")
    if "nvidia-caps" in majors and reads.isdir(caps_dir):
        for name in sorted(reads.listdir(caps_dir)):
            m = re.fullmatch(r"nvidia-cap([0-9]{1,9})", name)
            if m:
                wanted[f"nvidia-caps/{name}"] = (majors["nvidia-caps"], int(m.group(1)))
    imex_dir = os.path.join(root, "dev", IMEX_DIR)
    if IMEX_MAJOR_NAME in majors and reads.isdir(imex_dir):
        for name in sorted(reads.listdir(imex_dir)):
            m = re.fullmatch(r"channel([0-9]{1,9})", name)
            if m:
                wanted[f"{IMEX_DIR}/{name}"] = (majors[IMEX_MAJOR_NAME], int(m.group(1)))
    found = {}
    for name, (major, minor) in wanted.items():
        source = os.path.join(root, "dev", name)
        try:
            st = reads.lstat(source)
        except FileNotFoundError:
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            kind = "char" if stat.S_ISCHR(st.st_mode) else "not a char device"
            raise DriverError(f"{source}: expected char device {major}:{minor}, found {kind} "
                              f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        found[name] = DeviceNode("/dev/" + name, source, major, minor)
    return found


_DRI_LINK = re.compile(r"\.\./((card|renderD)([0-9]{1,5}))")


def dri_link(busid: str, node: str) -> str:
    """The /dev/dri/by-path name of a GPU's DRI node (udev's: pci-<domain:bus:dev.fn>-card)."""
    domain, _, rest = busid.partition(":")
    return f"by-path/pci-{int(domain, 16):04x}:{rest}-{'card' if node.startswith('card') else 'render'}"


def dri(root: str, gpus: list[Gpu]) -> tuple[dict[str, tuple[str, ...]], dict[str, DeviceNode]]:
    """Each GPU's DRI nodes, found through udev's /dev/dri/by-path links (matched by PCI bus
    id, never by index); each node checked to be char 226:<its number>."""
    by_gpu, nodes = {}, {}
    for g in gpus:
        names = []
        for kind in ("card", "render"):
            link = os.path.join(root, "dev/dri", dri_link(g.busid, kind))
            try:
                m = _DRI_LINK.fullmatch(reads.readlink(link))
            except (FileNotFoundError, NotADirectoryError, ValueError):
                continue
            except OSError as e:
                raise DriverError(f"{link}: cannot read: {e.strerror}") from None
            if m is None:
                raise DriverError(f"{link}: expected a link to ../card<N> or ../renderD<N>")
            source = os.path.join(root, "dev/dri", m.group(1))
            st = lstat_or_none(source)
            if st is None:
                continue
            if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (DRM_MAJOR, int(m.group(3))):
                raise DriverError(f"{source}: expected char device {DRM_MAJOR}:{int(m.group(3))}")
            nodes["dri/" + m.group(1)] = DeviceNode("/dev/dri/" + m.group(1), source, DRM_MAJOR, int(m.group(3)))
            names.append("dri/" + m.group(1))
        if names:
            by_gpu[g.busid] = tuple(names)
    return by_gpu, nodes


def _cap_minor(kernel: Resolver, rel: str) -> int | None:
    """DeviceFileMinor of a capability's access file (/proc/driver/nvidia/capabilities/...)."""
    text = read_text(kernel, f"proc/driver/nvidia/{rel}")
    if text is None:
        return None
    m = re.search(r"^DeviceFileMinor:\s*([0-9]{1,9})\s*$", text, re.M)
    if m is None:
        raise DriverError(f"{kernel.root}/proc/driver/nvidia/{rel}: no valid 'DeviceFileMinor:' line")
    return int(m.group(1))


def migs(kernel: Resolver, gpus: list[Gpu]) -> tuple[list[Mig], dict[str, int]]:
    """The MIG devices the driver shows under /proc/driver/nvidia/capabilities: a
    gpu<minor>/mig/gi<G>/ci<C> directory per compute instance (the instances that exist;
    /proc/driver/nvidia-caps/mig-minors lists every possible one)."""
    caps = {n: m for n in ("config", "monitor") if (m := _cap_minor(kernel, f"capabilities/mig/{n}")) is not None}
    migs = []
    for g in gpus:
        base = in_root(kernel, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig")
        if base is None or not reads.isdir(base):
            continue
        for gi_name in sorted(reads.listdir(base), key=_number_in):
            gi = re.fullmatch(r"gi([0-9]{1,4})", gi_name)
            if gi is None or (gi_cap := _cap_minor(kernel, f"capabilities/gpu{g.minor}/mig/{gi_name}/access")) is None:
                continue
            gi_dir = in_root(kernel, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig/{gi_name}")
            if gi_dir is None or not reads.isdir(gi_dir):
                continue
            for ci_name in sorted(reads.listdir(gi_dir), key=_number_in):
                ci = re.fullmatch(r"ci([0-9]{1,4})", ci_name)
                rel = f"capabilities/gpu{g.minor}/mig/{gi_name}/{ci_name}/access"
                if ci is not None and (ci_cap := _cap_minor(kernel, rel)) is not None:
                    migs.append(Mig(g.minor, int(gi.group(1)), int(ci.group(1)), gi_cap, ci_cap))
    return migs, caps


def _number_in(name: str) -> tuple[int, str]:
    m = re.search(r"[0-9]{1,9}", name)
    return (int(m.group()) if m else -1, name)
