"""The process plan sandbox/frontend.c carries out, for exec's process (sandbox/exec_frontend.py)
and for a created init (gofer/remote_init.py): NUL-terminated "KEY VALUE" records, with the
fds they name sent in the same order as SCM_RIGHTS. Python works out every value; C only
applies them, in gofer.process.tail's order."""

from __future__ import annotations

import os
import resource

from gofer import process
from mounts.errors import BundleError, ExecError, ProcessError
from mounts.spec import Personality, Process, Seccomp

MAX_PLAN = 200_000  # bytes: well inside a SOCK_SEQPACKET message (the socket's send buffer)
# frontend.c's tables, defined here alone: sandbox/launcher.py writes them into the header
# frontend.c is built with (c_defines), so the two can never disagree
MAX_FDS = 64  # fds a plan carries
MAX_ITEMS = 4096  # argv and envp slots each, their NULL included (HOME counts among the env)
MAX_GROUPS, MAX_RLIMITS, MAX_NS, MAX_CGROUPS = 256, 32, 8, 32


def c_defines() -> str:
    """The limits above as C macros (PLAN_MAX_ITEMS ...), for frontend.c."""
    return "".join(f"#define PLAN_{name} {value}\n" for name, value in (
        ("MAX_FDS", MAX_FDS), ("MAX_ITEMS", MAX_ITEMS), ("MAX_GROUPS", MAX_GROUPS), ("MAX_RLIMITS", MAX_RLIMITS),
        ("MAX_NS", MAX_NS), ("MAX_CGROUPS", MAX_CGROUPS)))


def unsupported(proc: Process, console, seccomp: Seccomp | None, personality: Personality | None) -> str | None:
    """What the plan cannot carry, or None."""
    if console is not None or proc.terminal:
        return "a terminal"
    if personality is not None or proc.scheduler is not None or proc.io_priority is not None:
        return "scheduling or a personality"
    if proc.apparmor_profile or proc.selinux_label:
        return "an LSM label"
    if seccomp is not None and (seccomp.flags or seccomp.listener_path or seccomp.default_action == "SCMP_ACT_NOTIFY"
                                or any(r.action == "SCMP_ACT_NOTIFY" for r in seccomp.syscalls)):
        return "seccomp flags or a listener"
    return None


def too_big(proc: Process) -> str | None:
    """Why the plan cannot carry ``proc`` (frontend.c's fixed tables, one message), or None."""
    if (len(proc.args) > MAX_ITEMS - 1 or len(proc.env) + 1 > MAX_ITEMS - 1  # (+ HOME)
            or len(proc.user.additional_gids) > MAX_GROUPS or len(proc.rlimits) > MAX_RLIMITS):
        return "more arguments, variables, groups or rlimits than the launcher's plan holds"
    if sum(len(a) + 8 for a in proc.args) + sum(len(e) + 8 for e in proc.env) > MAX_PLAN // 2:
        return "a command line or environment too big for the launcher's plan"
    return None


def process_records(proc: Process) -> list[str]:
    """The process's credentials, capabilities as masks, umask and rlimits."""
    caps = proc.capabilities or process.NO_CAPABILITIES
    masks = [sum(1 << c for c in process._cap_numbers(getattr(caps, f), f))
             for f in ("bounding", "permitted", "inheritable", "effective", "ambient")]
    user = proc.user
    records = [f"nnp {int(proc.no_new_privileges)}", f"lastcap {process.LAST_CAP}",
               f"umask {user.umask if user.umask is not None else process.DEFAULT_UMASK}",
               f"codes {ProcessError.exit_code} {ExecError.exit_code} {BundleError.exit_code}", "caps " + " ".join(f"{m:x}" for m in masks),
               f"user {user.uid} {user.gid}", *(f"group {g}" for g in user.additional_gids)]
    # (the text after the numbers: what an error names, as gofer.process.set_rlimits does)
    return records + [f"rlimit {getattr(resource, rl.type)} {rl.soft} {rl.hard} [{i}]: {rl.type} soft {rl.soft} "
                      f"hard {rl.hard}" for i, rl in enumerate(proc.rlimits)]


def seccomp_memfd(bpf: bytes) -> int:
    """The filter, exported as BPF, in a memory file the front end reads."""
    memfd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
    os.write(memfd, bpf)
    return memfd


def command_records(proc: Process, entry: process.Entry) -> list[str]:
    """argv, and the environment with HOME as looked up."""
    return [f"arg {a}" for a in proc.args] + [f"env {k}={v}" for k, v in process.environment(proc, entry).items()]


def encode(records: list[str], fds: list[int]) -> bytes | None:
    """The message, or None where it cannot be one (a NUL in a value, too big, too many fds)."""
    data = b"".join(os.fsencode(r) + b"\0" for r in records)
    if any("\0" in r for r in records) or len(data) > MAX_PLAN or len(fds) > MAX_FDS:
        return None
    return data
