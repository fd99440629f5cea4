"""`sandbox create` with the warm server: the server's child runs the verb's Python (the
command line, the state, the bundle, the cgroup with the launcher in it, the plan) and forks
the gofer, warm; the container's init is made by the launcher, as its child, and the gofer
builds its root from inside its namespaces and hands it its process (gofer/remote_init.py,
sandbox/frontend.c). No Python starts on the container's path.

The prestart and createRuntime hooks run here while the builder waits, as in Python; the
createContainer hooks run from the builder, in the container's namespaces before pivot_root.
What the launcher's init cannot do is declined before anything happens, and the launcher
runs create in Python as before: a terminal, a user namespace, a pid or mount namespace that
is not the container's own, startContainer hooks (pid 1 would run them), and what exec's
plan cannot carry (gofer/frontend_plan.py)."""

from __future__ import annotations

import socket

from gofer.frontend_plan import MAX_PLAN, unsupported
from mounts.bundle import load_bundle
from mounts.errors import SandboxError
from mounts.request import resolve
from sandbox.exec_frontend import Decline


class CreateFrontend:
    """The launcher at the other end of ``conn``: its pid (it joins the cgroup) and the fd
    the gofer reaches it by."""

    def __init__(self, conn: socket.socket, pid: int):
        conn.settimeout(None)  # (the request's deadline is over; the gofer talks to it next)
        self.conn, self.pid = conn, pid
        self.planned = False  # (declines come before anything is sent)

    def check(self, args) -> None:
        """Raise Decline where the launcher's init cannot serve this bundle. A bundle that
        cannot be read is not declined: the verb says so, as it would in Python."""
        from sandbox.launch import options

        opts = options(args, detached=True, foreground=False)
        if opts.console_socket:
            raise Decline("a terminal")
        try:
            spec = resolve(load_bundle(opts.bundle).spec, opts.gpus, opts.capabilities, opts.max_capabilities,
                           opts.cdi_spec_dirs)[0]
        except SandboxError:
            return
        why = why_not(spec)
        if why is not None:
            raise Decline(why)

    def launcher(self) -> tuple[int, int]:
        return self.pid, self.conn.fileno()


def why_not(spec) -> str | None:
    """Why the launcher's init cannot serve ``spec``, or None."""
    proc = spec.process
    if proc is None:
        return None  # (an error either way: the verb says so)
    namespaces = {ns.type: ns.path for ns in spec.linux.namespaces}
    if "user" in namespaces:
        return "a user namespace"
    if "pid" not in namespaces or namespaces["pid"]:
        return "no pid namespace of the container's own"
    if namespaces.get("mount"):
        return "a mount namespace named by path"
    hooks = spec.hooks.ours() if spec.hooks is not None else None
    if hooks is not None and hooks.start_container:  # (pid 1 would run them, after start)
        return "startContainer hooks"
    if sum(len(a) + 8 for a in proc.args) + sum(len(e) + 8 for e in proc.env) > MAX_PLAN // 2:
        return "a command line or environment too big for the launcher's plan"
    return unsupported(proc, None, spec.linux.seccomp, spec.linux.personality)
