"""Our own CDI spec (``sandbox cdi generate``): the devices of an inventory's GPUs and the
edits that give a container what `sandbox run` mounts, planned as the plan plans it; its
hook makes the links and the ld.so.cache (sandbox/verbs/cdi.py). The reading of anyone's
specs, and their application to a bundle, is mounts/cdi.py."""

from __future__ import annotations

import os

import msgspec

from mounts.cdi import (
    KIND,
    CdiSpec,
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Mount,
    minimum_version,
)

FILE_OPTS = ["ro", "nosuid", "nodev", "bind"]
IPC_OPTS = ["nosuid", "nodev", "noexec", "bind"]


def driver_layout(inventory):
    """Where the driver root itself keeps its libraries: a spec serves any image, and
    puts each file where the host has it (as nvidia-ctk does); the cache says where."""
    from mounts.layout import Layout
    from mounts.ldcache import FLAG_REQUIRED_MASK

    def libdir(is64: bool, default: str) -> str:
        lib = next((x for x in inventory.libraries if bool(x.flags & FLAG_REQUIRED_MASK) == is64), None)
        return "/" + os.path.relpath(os.path.dirname(lib.path), inventory.root) if lib else default
    return Layout(libdir(True, "/usr/lib64"), libdir(False, "/usr/lib32"))


def generate(inventory, hook: list[str], hook_env: list[str]) -> CdiSpec:
    """The spec of ``inventory``'s GPUs: a device per index, per UUID and ``all``; the
    control nodes, every driver file (where the driver root keeps it) and one
    createRuntime hook of ours (``hook`` + its --link and --cache-entry arguments) that
    makes the links and the container's ld.so.cache, for all of them (sandbox/verbs/cdi.py)."""
    from mounts import actions as A
    from mounts.driver_nodes import dri_link
    from mounts.plan import iter_plan
    from mounts.request import CAPABILITIES, GpuRequest

    layout = driver_layout(inventory)
    request = GpuRequest(("all",), frozenset(CAPABILITIES) - {"compat32"})
    actions = list(iter_plan(request, inventory, layout, list(inventory.gpus)))
    # a GPU's own nodes: its /dev/nvidia<minor> and DRI nodes; the by-path links to the
    # latter are made by a hook of that device's, so that no link names an absent GPU
    own = {g.busid: [f"/dev/nvidia{g.minor}"] + [f"/dev/{n}" for n in inventory.dri.get(g.busid, ())]
           for g in inventory.gpus}
    gpu_nodes = {t for targets in own.values() for t in targets}
    by_path = {a.target for a in actions if isinstance(a, A.Symlink) and a.target.startswith("/dev/dri/by-path/")}

    def node(path: str, source: str, major: int, minor: int) -> DeviceNode:
        return DeviceNode(path, host_path=source if source != path else None, type="c", major=major, minor=minor)

    devs = [a for a in actions if isinstance(a, A.Device)]
    common = [node(a.target, a.source, a.major, a.minor) for a in devs if a.target not in gpu_nodes]
    by_target = {a.target: node(a.target, a.source, a.major, a.minor) for a in devs if a.target in gpu_nodes}
    links = {a.target: a.source for a in actions if isinstance(a, A.Symlink) and a.target in by_path}
    mounts = [Mount(a.source, a.target, options=IPC_OPTS if isinstance(a, A.Ipc) else FILE_OPTS)
              for a in actions if isinstance(a, A.Library | A.Binary | A.Firmware | A.Ipc)
              or isinstance(a, A.Config) and a.data is None]
    args = [os.path.basename(hook[0]), *hook[1:]]
    for a in actions:
        if isinstance(a, A.Symlink) and a.target not in by_path:
            args += ["--link", f"{a.source}::{a.target}"]
        elif isinstance(a, A.Config) and a.data is not None:  # the host's file made the container's
            args += ["--file", f"{a.target}::{a.data}"]
        elif isinstance(a, A.LdCache):
            args += [arg for e in a.entries for arg in ("--cache-entry", f"{e.key}::{e.value}::{e.flags:#x}")]
    edits = ContainerEdits(env=["NVIDIA_VISIBLE_DEVICES=void"], device_nodes=common, mounts=mounts,
                           hooks=[Hook("createRuntime", hook[0], args, hook_env)])

    def gpu_edits(busids: list[str]) -> ContainerEdits:
        nodes = [by_target[t] for b in busids for t in own[b] if t in by_target]
        mine = [(links[t], t) for b in busids for n in inventory.dri.get(b, ())
                if (t := "/dev/dri/" + dri_link(b, n.rpartition("/")[2])) in links]
        hooks = [Hook("createRuntime", hook[0], args[:len(hook)] + [x for c, t in mine for x in ("--link", f"{c}::{t}")],
                      hook_env)] if mine else []
        return ContainerEdits(device_nodes=nodes, hooks=hooks)

    devices = []
    for g in inventory.gpus:
        one = gpu_edits([g.busid])
        devices += [Device(str(g.index), one), Device(g.uuid, one)]
    for m in inventory.migs:  # as nvidia-ctk's: the parent's node and the instances' caps nodes
        gpu = next(g for g in inventory.gpus if g.minor == m.minor)
        nodes = [node(d.path, d.source, d.major, d.minor)
                 for name in (f"nvidia{m.minor}", f"nvidia-caps/nvidia-cap{m.gi_cap}", f"nvidia-caps/nvidia-cap{m.ci_cap}")
                 if (d := inventory.devices.get(name)) is not None]
        devices.append(Device(f"{gpu.index}:{m.gi}:{m.ci}", ContainerEdits(device_nodes=nodes)))
    devices.append(Device("all", gpu_edits([g.busid for g in inventory.gpus])))
    spec = CdiSpec("0.3.0", KIND, devices, edits)
    return msgspec.structs.replace(spec, cdi_version=minimum_version(spec))
