"""``sandbox hook``: the GPU setup as an OCI prestart/createRuntime hook for runc and crun.

The runtime runs us after it has created the container's namespaces and mounted its root,
before pivot_root, with the container's state on stdin. We plan from the bundle's
config.json, join the container's mount namespace and mount into its rootfs: the same code
path as ``sandbox run``, through sandbox.api.

Defences (CVE-2025-23266): nothing of the image's environment is used but the NVIDIA_*
request; we start no process; the hook entry we install is the `sandbox` launcher (the warm
server's client; without one it runs Python isolated, -IS: no PYTHON* variables, no cwd on
sys.path) with a fixed PATH, and the work is done from "/" not the rootfs.

``sandbox hook install BUNDLE`` adds that entry to the bundle's config.json.
"""

from __future__ import annotations

import os
import sys
import time

import msgspec

from mounts.errors import BundleError, SandboxError

HOOK_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def hook_env() -> list[str]:
    """A hook entry's environment: PATH, and the installer's $SANDBOX_SERVER_IDLE where set
    (how long a server the launcher starts for a hook stays idle; 0: none is started)."""
    idle = os.environ.get("SANDBOX_SERVER_IDLE")
    return HOOK_ENV + ([f"SANDBOX_SERVER_IDLE={idle}"] if idle is not None else [])


HOW = ("runc and crun run the hook with the container's state on stdin; add it to a bundle with "
       "`sandbox hook install BUNDLE`")
class ContainerState(msgspec.Struct):
    """What runc and crun write to a hook's stdin."""

    id: str
    pid: int
    bundle: str
    ociVersion: str = ""  # noqa: N815 - the spec's field name
    status: str = ""


STATE = msgspec.json.Decoder(ContainerState)  # (built once: the warm server's children inherit it)


def main(args) -> int:
    if args.action == "install":
        return install(args)
    return run_hook(args, sys.stdin.buffer.read())


def run_hook(args, state_json: bytes) -> int:
    """The hook's work for the container whose state (runc's or crun's JSON) is given."""
    # Paths given relative to where the runtime started us mean that, not "/"; then never
    # work from inside the container's rootfs (CVE-2025-23266: cwd in the rootfs).
    args.driver_root, args.dev_root, args.trace = (p and os.path.abspath(p) for p in (args.driver_root, args.dev_root,
                                                                                      args.trace))
    os.chdir("/")
    from gofer.spans import Spans
    from mounts.bundle import load_bundle
    from sandbox.api import apply_plan, plan_bundle

    spans = Spans(bool(args.trace), os.getpid())
    t = time.monotonic_ns()
    if not state_json.strip():
        raise BundleError(f"container state on stdin: empty ({HOW})")
    try:
        state = STATE.decode(state_json)
    except msgspec.DecodeError as e:
        raise BundleError(f"container state on stdin: {e}") from None
    bundle = load_bundle(state.bundle)
    spans.add("state + bundle", t)
    with spans.span("plan"):
        plan = plan_bundle(bundle, args.driver_root, max_capabilities=args.capabilities, dev_root=args.dev_root,
                           native_only=True)
    if not plan.actions:
        return 0  # no GPU asked for (the driver root was not even read): touch nothing
    with spans.span("mounts", actions=len(plan.actions)):
        apply_plan(plan.actions, bundle.rootfs, pid=state.pid)
    if args.trace:
        from sandbox.trace import write_trace

        write_trace(args.trace, spans.items)
    return 0


def ours(entry: dict) -> bool:
    """Whether a hook entry is one `hook install` wrote: the launcher's `hook`, or an older
    installation's (our Python's -c program, behind its C client or not)."""
    from mounts.spec import our_verb

    return our_verb(str(entry.get("path", "")), [str(a) for a in entry.get("args") or []], ("hook",)) is not None


def install(args) -> int:
    """Add (or replace) our entry in config.json's hooks, written atomically."""
    import json

    if not args.bundle:
        raise SandboxError("hook install: which bundle? (sandbox hook install BUNDLE)")
    config = os.path.join(os.path.abspath(args.bundle), "config.json")
    try:
        with open(config) as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise BundleError(f"{config}: no such file") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{config}: invalid JSON: {e}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("hooks", {}), dict):
        raise BundleError(f"{config}: hooks must be an object")
    # the `sandbox` launcher: a hook the warm server serves starts no Python; where none is of
    # use, it runs our Python isolated (-IS) with this installation's paths (sandbox/executor/launcher.c)
    hook_args = ["sandbox", "hook", "--driver-root", os.path.abspath(args.driver_root)]
    if args.dev_root:
        hook_args += ["--dev-root", os.path.abspath(args.dev_root)]
    if args.capabilities:
        hook_args += ["--capabilities", args.capabilities]
    if args.trace:
        hook_args += ["--trace", os.path.abspath(args.trace)]
    if args.server:
        hook_args += ["--server", os.path.abspath(args.server)]
    from sandbox.executor.build import installed

    entry = {"path": installed(), "args": hook_args, "env": hook_env()}
    hooks = spec.setdefault("hooks", {})
    for stage in ("prestart", "createRuntime"):
        hooks[stage] = [h for h in hooks.get(stage, []) if not ours(h)]
        if not hooks[stage]:
            del hooks[stage]
    hooks.setdefault(args.stage, []).append(entry)
    from mounts.atomic import write_atomically

    write_atomically(config, json.dumps(spec, indent=2).encode(), "hook install")
    print(f"added sandbox hook ({args.stage}) to {config}")
    return 0
