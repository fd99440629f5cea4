"""``sandbox update [-r FILE|-] [--memory 1G ...] ID``: new resource limits for a running
container, written to its cgroup as runc's update writes them (kubelet's
UpdateContainerResources reaches us so, through containerd's shim). The device rules stay as
they are: an update never widens or narrows what the container may open."""

from __future__ import annotations

import re
import sys

import msgspec

from mounts.errors import BundleError, SandboxError
from mounts.spec import Resources
from sandbox.state import StateDir

_SIZE = re.compile(r"(-?\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?", re.IGNORECASE)


def main(args) -> int:
    from sandbox.flags import UPDATE_FLAGS

    state = StateDir(args.root, args.container_id).load()
    if state.status not in ("running", "created"):
        raise SandboxError(f"cannot update container {state.id!r}: it is {state.status}")
    resources = _resources(args.resources) if args.resources else {}
    for flag, field in UPDATE_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        if field == "intelRdt":
            raise SandboxError(f"update {flag}: Intel RDT (resctrl) is not supported")
        section, key = field.split(".")
        resources.setdefault(section, {})[key] = _value(flag, field, value)
    try:
        r = msgspec.convert(resources, Resources)
    except msgspec.ValidationError as e:
        raise BundleError(f"update: linux.resources: {e}") from None
    r = msgspec.structs.replace(r, devices=[])  # (kept: see above)
    from mounts.bundle import Invalid, check_resources

    try:
        check_resources(r)
    except Invalid as e:
        raise BundleError(f"update: {e}") from None
    from gofer import cgroups

    if not state.cgroup:
        raise SandboxError(f"container {state.id!r} has no cgroup to update")
    r = cgroups.merged(state.cgroup, r)  # what runc keeps in its state: the memory limits not given
    if state.systemd_unit:  # the unit's properties first, as runc's systemd driver
        from gofer import systemd

        systemd.update(state.systemd_unit, systemd.resource_properties(r, cgroups.unified()),
                       lambda: cgroups.update(state.cgroup, r), frozen=state.cgroup if state.status == "running" else [])
    else:
        cgroups.update(state.cgroup, r)
    return 0


def _resources(path: str) -> dict:
    if path == "-":
        data = sys.stdin.buffer.read(1 << 20)
    else:
        from mounts.bundle import read_config

        data = read_config(path, "")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise BundleError(f"update --resources {path}: {e}") from None
    if not isinstance(value, dict):
        raise BundleError(f"update --resources {path}: not a JSON object (linux.resources)")
    return value


def _value(flag: str, field: str, value: str) -> int | str:
    """runc's readings: cpusets as they are; memory in bytes with k/m/g/t/p (1024 each), -1
    for no limit; the rest plain integers."""
    if field in ("cpu.cpus", "cpu.mems"):
        return value
    if field.startswith("memory."):
        m = _SIZE.fullmatch(value.strip())
        if m is None:
            raise SandboxError(f"update {flag}: {value!r} is not a size (such as 512m or 2g, or -1)")
        number, unit = float(m.group(1)), m.group(2).lower()
        return int(number * 1024 ** " kmgtp".index(unit or " "))
    try:
        return int(value)
    except ValueError:
        raise SandboxError(f"update {flag}: {value!r} is not a number") from None
