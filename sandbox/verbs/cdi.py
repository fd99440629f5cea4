"""``sandbox cdi generate | list | hook``: our CDI spec, the devices the CDI specs here
define, and the hook our spec names (mounts/cdi.py has the rules).

The hook makes the driver's links and the container's ld.so.cache with our own writer, in
an overlay of the image's directories, before pivot_root, with the state on stdin. Our spec
names it a createRuntime hook: the runtime runs it in its own namespaces, it joins the
container's mount namespace by the state's pid (gofer/embed.py), and so the warm server can
do it (the spec names the `sandbox` launcher, the server's client: no Python starts per
container). Written as a createContainer hook (runc and crun run those inside
the container's mount namespace) it mounts where it is. It never runs ldconfig or anything
of the image's, uses only its own environment and works from "/", not the rootfs
(CVE-2025-23266, CVE-2025-23267).
"""

from __future__ import annotations

import os
import sys

import msgspec

from mounts import cdi, cdi_generate
from mounts.errors import BundleError, SandboxError

HOW = "runc and crun run it with the container's state on stdin, from a CDI spec (`sandbox cdi generate`)"


def main(args) -> int:
    if args.action == "generate":
        return generate(args)
    if args.action == "list":
        registry = cdi.load([*cdi.SPEC_DIRS, *args.cdi_spec_dir])
        for name in registry.qualified_names():
            print(name)
        for why in registry.errors.values():
            print(f"sandbox cdi list: warning: {why}", file=sys.stderr)
        return 0
    return hook(args)


def generate(args) -> int:
    from mounts.driver import discover
    from sandbox.executor.build import installed
    from sandbox.verbs.hook import hook_env

    inventory = discover(args.driver_root, args.dev_root)
    if args.debug:  # what discovery passed over: wrappers, links leading nowhere ...
        for note in inventory.notes:
            print(f"sandbox cdi generate: debug: {note}", file=sys.stderr)
    if not inventory.gpus:
        raise SandboxError(f"{inventory.dev_root}: no NVIDIA GPU found (/proc/driver/nvidia/gpus is empty)")
    spec = cdi_generate.generate(inventory, [installed(), "cdi", "hook"], hook_env())
    if args.format == "json":
        text = msgspec.json.format(msgspec.json.encode(spec), indent=2).decode() + "\n"
    else:
        from msgspec import yaml

        text = yaml.encode(spec).decode()
    if not args.output:
        sys.stdout.write(text)
        return 0
    from mounts.atomic import write_atomically

    write_atomically(args.output, text.encode(), "--output")
    return 0


def hook(args) -> int:
    """The hook's work for the container whose state is on stdin."""
    from gofer.embed import join_mount_namespace
    from mounts.bundle import load_bundle
    from mounts.cdi import hook_actions
    from sandbox.api import apply_plan
    from sandbox.verbs.hook import STATE

    os.chdir("/")
    try:
        state = STATE.decode(sys.stdin.buffer.read())
    except msgspec.DecodeError as e:
        raise BundleError(f"container state on stdin: {e}") from None
    actions = hook_actions(args.link, args.file, args.cache_entry)
    bundle = load_bundle(state.bundle)  # (read where the runtime runs us: the bundle is its path)
    if not _mount_here(state.pid):
        join_mount_namespace(state.pid)  # createRuntime, or the warm server's child
    apply_plan(actions, bundle.rootfs)
    return 0


def _mount_here(pid: int) -> bool:
    """Where the container's mount namespace is: False where the state's pid is a process
    we see in another mount namespace (a createRuntime hook, run in the runtime's
    namespaces, or the warm server's child: join it); True where we are in it already (a
    createContainer hook: runc and crun run those in the container's mount namespace). That
    must then be no mount namespace of the host's: not pid 1's, and not that of the
    processes that started us (the runtime's, outside; the state's pid may name nothing in
    the /proc we see, so the test is on our ancestors). Anything else is refused."""
    def mnt(p: int | str) -> int | None:
        try:
            return os.stat(f"/proc/{p}/ns/mnt").st_ino
        except OSError:
            return None

    def parent(p: int | str) -> int:  # as the /proc we read numbers it (our own pid namespace may not)
        with open(f"/proc/{p}/status", "rb") as f:
            return int(next(line for line in f if line.startswith(b"PPid:")).split()[1])

    ours, theirs = mnt("self"), mnt(pid)
    if theirs is not None and theirs != ours:
        return False
    outside, p = False, parent("self")
    for _ in range(64):  # our ancestors, up to where /proc lets us see (pid 1 may be hidden)
        ns = mnt(p)
        if ns is None or p <= 1:
            break
        if ns != ours:
            outside = True
            break
        p = parent(p)
    if ours is None or ours == mnt(1) or not outside:
        raise SandboxError("runs only as a createRuntime hook (the container's init given by the state) or a "
                           "createContainer hook (in the container's mount namespace); refusing to mount here")
    return True
