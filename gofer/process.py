"""The container process: rlimits, cwd, user and groups, capabilities, no_new_privs, exec."""

from __future__ import annotations

import os
import resource
import signal

import prctl

from gofer import syscalls as sc
from mounts.spec import Process


class ProcessError(Exception):
    pass


class ExecError(ProcessError):
    """execve failed: the container's command could not start (exit status 127, as shells)."""


def _cap_numbers(names: list[str], field: str) -> list[int]:
    caps = []
    for name in names:
        short = name.lower().removeprefix("cap_")
        if short not in prctl.ALL_CAP_NAMES:
            raise ProcessError(f"process.capabilities.{field}: unknown capability {name!r}")
        caps.append(getattr(prctl, "CAP_" + short.upper()))
    return caps


def set_rlimits(proc: Process) -> None:
    for rl in proc.rlimits:
        which = getattr(resource, rl.type, None)
        if which is None:
            raise ProcessError(f"process.rlimits: unknown limit {rl.type!r}")
        try:
            resource.setrlimit(which, (rl.soft, rl.hard))
        except (ValueError, OSError) as e:
            raise ProcessError(f"process.rlimits: {rl.type}={rl.soft}/{rl.hard}: {e}") from None


def become(proc: Process) -> None:
    """Switch to the spec's user with exactly the spec's capabilities.

    Order matters: the bounding set is cut while we still hold CAP_SETPCAP; KEEPCAPS keeps
    the permitted set across setuid to a non-zero uid; then one capset(2) for effective,
    permitted and inheritable, and last ambient (needs the cap permitted and inheritable)."""
    caps = proc.capabilities
    if caps is not None:
        keep = set(_cap_numbers(caps.bounding, "bounding"))
        for cap in range(0, prctl.CAP_LAST_CAP + 1):
            if cap not in keep:
                prctl.capbset_drop(cap)
        prctl.set_keepcaps(True)
    user = proc.user
    try:
        os.setgroups(user.additional_gids)
        os.setgid(user.gid)
        os.setuid(user.uid)
    except OSError as e:
        raise ProcessError(f"process.user: uid {user.uid} gid {user.gid}: {e.strerror}") from None
    if user.umask is not None:
        os.umask(user.umask)
    if caps is not None:
        permitted = set(_cap_numbers(caps.permitted, "permitted"))
        inheritable = set(_cap_numbers(caps.inheritable, "inheritable"))
        sc.capset(set(_cap_numbers(caps.effective, "effective")), permitted, inheritable)
        for cap in _cap_numbers(caps.ambient, "ambient"):
            if cap in permitted and cap in inheritable:
                sc.cap_ambient_raise(cap)
        prctl.set_keepcaps(False)


def exec_process(proc: Process) -> None:
    """cwd, no_new_privs, PDEATHSIG (credential changes cleared it), then execvpe with the
    spec's environment only: nothing of ours, nothing of the caller's."""
    try:
        os.chdir(proc.cwd)
    except OSError as e:
        raise ProcessError(f"process.cwd {proc.cwd}: {e.strerror}") from None
    if proc.no_new_privileges:
        prctl.set_no_new_privs(1)
    prctl.set_pdeathsig(signal.SIGKILL)
    env = dict(item.partition("=")[::2] for item in proc.env)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        os.execvpe(proc.args[0], proc.args, env)
    except OSError as e:
        raise ExecError(f"exec {proc.args[0]}: {e.strerror}") from None
