"""``sandbox delete [--force] ID``: remove a stopped container's state; with --force a
created or running one's too, after killing every process in it. Then the poststop hooks.
(runc deletes a created container without --force; the runtime spec says a container that
is not stopped MUST NOT be deleted, and so do we.) A container still being created is
refused, --force or not (runc: it does not exist until create has written its state); one
whose create died is removed without a signal: only what we made goes (the cgroups, the
systemd unit we started), never a process we do not know to be the container's."""

from __future__ import annotations

import os

from mounts.errors import SandboxError
from sandbox.processes import kill_all
from sandbox.state import StateDir, being_created, not_found, remove_cgroups


def main(args) -> int:
    sd = StateDir(args.root, args.container_id)
    if sd.is_link():  # not ours: --force removes the link itself (as runc), never its target's files
        if not args.force:
            raise SandboxError(f"{sd.dir}: not a state directory (a link or a file is in its place)")
        sd.remove()
        return 0
    state = sd._read()
    if state is None:
        if not os.path.lexists(sd.dir):
            if args.force:
                return 0
            raise not_found(args.container_id, args.root)
        sd.remove()  # a create that died before writing its state: nothing runs
        return 0
    status = state.status
    if status == "creating":
        raise being_created(state, args.root)
    if status != "stopped" and not args.force:
        raise SandboxError(f"cannot delete container {state.id!r} that is not stopped: {status}")
    if status != "stopped" or not state.pid_ns_own:  # (kill_all leaves a creating one alone)
        # without a pid namespace of its own, what the container left running in its cgroup
        # outlives its init: killed too, as runc's destroy does
        kill_all(state)
    remove_cgroups(state)
    if state.poststop:
        from gofer.hooks import run_hooks, state_json

        try:
            run_hooks(state.hooks("poststop"), "poststop", state_json(state.id, "stopped", 0, state.bundle, state.annotations))
        except SandboxError as e:
            from sandbox.messages import warn

            warn(str(e))
    sd.remove()
    return 0
