"""The Python API for runtimes that embed the GPU setup (and what the CLI verbs call).

    from sandbox.api import plan_bundle, apply_plan
    plan = plan_bundle("/path/to/bundle", driver_root="/")
    apply_plan(plan.actions, "/path/to/bundle/rootfs", pid=container_init_pid)

Both are synchronous and need no event loop. ``apply_plan`` mounts into the mount namespace
of ``pid`` (joined with setns, so call it from a single-threaded process you can spare, such
as a hook or a forked child), or into the caller's own namespace when ``pid`` is None: then
the caller must already be in a private mount namespace of its own. The mounting itself lives
in gofer/embed.py; this module only plans and re-exports it.
"""

from __future__ import annotations

from mounts.bundle import Bundle, load_bundle
from mounts.layout import layout_of
from mounts.plan import Plan, compute_plan
from mounts.request import GpuRequest, cap_request, resolve

__all__ = ["Plan", "apply_plan", "cap_request", "plan_bundle", "request_for"]  # noqa: F822 - apply_plan: see __getattr__


def __getattr__(name: str):
    """``apply_plan`` is gofer.embed's, imported on first use: planning alone (``sandbox
    plan``) never loads the syscall layer."""
    if name == "apply_plan":
        from gofer.embed import apply_plan

        return apply_plan
    raise AttributeError(name)


def request_for(bundle: Bundle, gpus: str | None = None, capabilities: str | None = None,
                max_capabilities: str | None = None, cdi_dirs: tuple[str, ...] = ()) -> GpuRequest | None:
    """The bundle's GPU request (its CDI devices, the CLI's overrides, the ceiling applied):
    mounts.request.resolve, as every path reads it."""
    return resolve(bundle.spec, gpus, capabilities, max_capabilities, cdi_dirs)[1]


def plan_bundle(bundle: str | Bundle, driver_root: str = "/", gpus: str | None = None,
                capabilities: str | None = None, max_capabilities: str | None = None,
                dev_root: str | None = None, cdi_dirs: tuple[str, ...] = (), native_only: bool = False) -> Plan:
    """The mount plan for ``bundle`` against the driver under ``driver_root``. A bundle that
    asks for no GPU gets an empty plan (and the driver root is not even looked at)."""
    from mounts.inventories import inventory as kept_inventory

    if isinstance(bundle, str):
        bundle = load_bundle(bundle)
    _, request, _ = resolve(bundle.spec, gpus, capabilities, max_capabilities, cdi_dirs, native_only)
    inventory = kept_inventory(driver_root, dev_root)[0] if request is not None else None
    return compute_plan(request, inventory, layout_of(bundle.rootfs))
