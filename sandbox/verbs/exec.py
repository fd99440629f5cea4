"""``sandbox exec ID [ARGS]``: a new process in a running container, set up as its init was.

Without --process the container's own process spec (from its bundle) is the base, and the
flags change it as runc's do: the args, -e added to the env, --cwd, -u, -g, --cap added,
--no-new-privs, -t. The launcher's executor makes the process (sandbox/executor/exec_plan.py)."""

from __future__ import annotations

import msgspec

from mounts.errors import BundleError, SandboxError
from mounts.spec import Process
from sandbox.state import StateDir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.executor.exec_plan import Frontend


def main(args, frontend: Frontend) -> int:
    """Run in the planner (the server's child, or the launcher's own): ``frontend`` sends the
    launcher the process's plan, and the launcher forks it (sandbox/executor/exec_plan.py)."""
    state = StateDir(args.root, args.container_id).load()
    if state.status not in ("running", "created"):
        raise SandboxError(f"cannot exec in container {state.id!r}: it is {state.status}")
    from mounts.bundle import load_bundle

    spec = load_bundle(state.bundle).spec
    proc = _process(args, spec, state.bundle)
    from gofer.cgroups import devices_enforced

    if not devices_enforced(state.cgroup):  # fail closed, as create does
        from sandbox.launch import NO_DEVICE_RULES

        raise SandboxError(NO_DEVICE_RULES)
    console = None
    if args.console_socket:
        if not proc.terminal:
            raise SandboxError("--console-socket needs a terminal (-t or process.terminal)")
        from gofer.process import connect_console

        console = connect_console(args.console_socket)
    pid = frontend.spawn(state.pid, proc, console, args.preserve_fds, args.detach, spec.linux.seccomp, state.cgroup,
                         state.start_time, spec.linux.personality)
    if args.pid_file:
        from sandbox.launch import write_pid_file

        write_pid_file(args.pid_file, pid)
    return 0  # (the launcher waits for its own child)


def _process(args, spec, bundle: str) -> Process:
    if args.process:
        from mounts.bundle import parse_process, read_config

        # a regular file of bounded size (/dev/zero or a FIFO is refused, not read)
        return parse_process(read_config(args.process, ""), spec, f"--process {args.process}")
    if not args.args or not args.args[0]:
        raise SandboxError("exec: which command? (sandbox exec ID COMMAND..., or --process FILE)")
    base = spec.process
    if base is None:
        raise BundleError(f"{bundle}/config.json: process is missing")
    for item in args.env:  # (runc: "invalid environment variable")
        if not item.partition("=")[0] or "=" not in item:
            raise SandboxError(f"--env {item[:64]!r}: expected NAME=VALUE", code=2)
    user = base.user
    if args.user:
        uid, _, gid = args.user.partition(":")
        if not uid.isascii() or not uid.isdigit() or (gid and not (gid.isascii() and gid.isdigit())):
            raise SandboxError(f"--user {args.user!r}: expected UID[:GID] in numbers")
        user = msgspec.structs.replace(user, uid=int(uid), gid=int(gid) if gid else user.gid)
    if args.additional_gids:
        user = msgspec.structs.replace(user, additional_gids=args.additional_gids)
    caps = base.capabilities
    if args.cap:
        from mounts.spec import Capabilities

        caps = caps or Capabilities()
        caps = Capabilities(*[getattr(caps, f) + args.cap for f in Capabilities.__struct_fields__])
    return msgspec.structs.replace(base, args=args.args, env=base.env + args.env, cwd=args.cwd or base.cwd,
                                   user=user, capabilities=caps, terminal=args.tty,
                                   no_new_privileges=base.no_new_privileges or args.no_new_privs,
                                   apparmor_profile=args.apparmor or base.apparmor_profile,
                                   selinux_label=args.process_label or base.selinux_label)
