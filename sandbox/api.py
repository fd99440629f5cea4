"""The Python API for runtimes that embed the GPU setup (and what the CLI verbs call).

    from sandbox.api import plan_bundle, apply_plan
    plan = plan_bundle("/path/to/bundle", driver_root="/")
    apply_plan(plan.actions, "/path/to/bundle/rootfs", pid=container_init_pid)

Both are synchronous and need no event loop. ``apply_plan`` mounts into the mount namespace
of ``pid`` (joined with setns, so call it from a single-threaded process you can spare, such
as a hook or a forked child), or into the caller's own namespace when ``pid`` is None: then
the caller must already be in a private mount namespace of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec

from mounts.actions import Action, Device
from mounts.errors import SandboxError
from mounts.plan import Plan, compute_plan, layout_of
from mounts.request import GpuRequest, gpu_request, parse_capabilities
from mounts.spec import Bundle, load_bundle


def request_for(bundle: Bundle, gpus: str | None = None, capabilities: str | None = None,
                max_capabilities: str | None = None) -> GpuRequest | None:
    """The bundle's GPU request (CLI overrides applied), capped at ``max_capabilities``."""
    request = gpu_request(bundle.spec, gpus, capabilities)
    if request is not None and max_capabilities:
        allowed = parse_capabilities(max_capabilities, "--capabilities")
        request = msgspec.structs.replace(request, capabilities=request.capabilities & allowed)
    return request


def plan_bundle(bundle: str | Bundle, driver_root: str = "/", gpus: str | None = None,
                capabilities: str | None = None, max_capabilities: str | None = None,
                dev_root: str | None = None) -> Plan:
    """The mount plan for ``bundle`` against the driver under ``driver_root``. A bundle that
    asks for no GPU gets an empty plan (and the driver root is not even looked at)."""
    from mounts.driver import discover

    if isinstance(bundle, str):
        bundle = load_bundle(bundle)
    request = request_for(bundle, gpus, capabilities, max_capabilities)
    inventory = discover(driver_root, dev_root) if request is not None else None
    return compute_plan(request, inventory, layout_of(bundle.rootfs))


def apply_plan(actions: Iterable[Action], rootfs: str, pid: int | None = None) -> int:
    """Perform ``actions`` inside ``rootfs`` (as the mount namespace sees it); returns how
    many were applied. With ``pid``, the GPU nodes are also allowed in its cgroup v1
    devices controller. On any error, everything already mounted is detached again and
    the error is raised."""
    from gofer import gpu
    from gofer import syscalls as sc
    from gofer.cgroups import allow_devices
    from gofer.root import Root

    actions = list(actions)
    if pid is not None:
        # A container's init lives in a mount namespace of its own; a pid in ours would have
        # us mount straight into the host's tree (a wrong or stale pid in the state JSON).
        try:
            theirs, ours = os.stat(f"/proc/{pid}/ns/mnt").st_ino, os.stat("/proc/self/ns/mnt").st_ino
        except OSError as e:
            raise SandboxError(f"pid {pid}: cannot see its mount namespace: {e.strerror}") from None
        if theirs == ours:
            raise SandboxError(f"pid {pid} shares our mount namespace: it is not a container's init; "
                               "refusing to mount into the host's tree")
        # the container's devices cgroup (host side) first, then its mount namespace
        allow_devices(pid, [(a.major, a.minor) for a in actions if isinstance(a, Device)])
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            sc.setns(fd, sc.CLONE_NEWNS, what=f"mount namespace of pid {pid}")
        finally:
            os.close(fd)
    root = Root(rootfs)
    n = 0
    try:
        for action in actions:
            gpu.apply(root, action)
            n += 1
    except BaseException:
        root.undo()
        raise
    finally:
        root.close()
    return n
