"""``sandbox cdi generate | list | hook``: our CDI spec, the devices the CDI specs here
define, and the createContainer hook our spec names (mounts/cdi.py has the rules).

The hook runs inside the container's mount namespace before pivot_root (runc and crun run
createContainer hooks there), with the state on stdin: it makes the driver's links and the
container's ld.so.cache with our own writer, in an overlay of the image's directories. It
never runs ldconfig or anything of the image's, uses only its own environment and works from
"/", not the rootfs (CVE-2025-23266, CVE-2025-23267).
"""

from __future__ import annotations

import os
import sys

import msgspec

from mounts import cdi
from mounts.errors import BundleError, SandboxError


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
    from sandbox.hook_cmd import HOOK_ENV
    from sandbox.launcher import entry_code

    inventory = discover(args.driver_root, args.dev_root)
    if not inventory.gpus:
        raise SandboxError(f"{inventory.dev_root}: no NVIDIA GPU found (/proc/driver/nvidia/gpus is empty)")
    hook = [sys.executable, "-I", "-S", "-c", entry_code(), "cdi", "hook"]
    spec = cdi.generate(inventory, hook, HOOK_ENV)
    obj = msgspec.to_builtins(spec)
    text = (msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() if args.format == "json"
            else cdi.to_yaml(obj)) + "\n"
    if not args.output:
        sys.stdout.write(text)
        return 0
    from sandbox.launch import write_atomically

    write_atomically(args.output, text.encode(), "--output")
    return 0


def hook(args) -> int:
    from mounts import actions as A
    from mounts.ldcache import Entry
    from mounts.spec import load_bundle
    from sandbox.api import apply_plan
    from sandbox.hook_cmd import ContainerState

    os.chdir("/")
    try:
        state = msgspec.json.decode(sys.stdin.buffer.read(), type=ContainerState)
    except msgspec.DecodeError as e:
        raise BundleError(f"container state on stdin: {e}") from None
    actions: list = []
    for link in args.link:
        content, sep, target = link.partition("::")
        if not sep or not os.path.isabs(target) or "/" in content:
            raise BundleError(f"--link {link!r}: expected NAME::/ABSOLUTE/PATH")
        actions.append(A.Symlink(content, target))
    entries = []
    for item in args.cache_entry:
        parts = item.split("::")
        if len(parts) != 3 or not os.path.isabs(parts[1]):
            raise BundleError(f"--cache-entry {item!r}: expected KEY::/ABSOLUTE/PATH::FLAGS")
        try:
            entries.append(Entry(parts[0], parts[1], int(parts[2], 0)))
        except ValueError:
            raise BundleError(f"--cache-entry {item!r}: FLAGS is not a number") from None
    if entries:
        actions.append(A.LdCache("", "/etc/ld.so.cache", A.RO_LIB, tuple(entries)))
    bundle = load_bundle(state.bundle)
    # createContainer: we are in the container's own mount namespace already
    apply_plan(actions, bundle.rootfs)
    return 0
