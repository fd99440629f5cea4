"""The process plan sandbox/executor/frontend.c carries out, for exec's process (sandbox/executor/exec_plan.py)
and for a created init (gofer/remote_init.py): NUL-terminated "KEY VALUE" records, with the
fds they name sent in the same order as SCM_RIGHTS. Python works out every value; C only
applies them, in gofer.process.tail's order."""

from __future__ import annotations

import os
import resource

from gofer import process
from mounts.errors import BundleError, ExecError, ProcessError, SandboxError
from mounts.spec import (
    IOPRIO_CLASSES,
    PERSONALITY_DOMAINS,
    SCHED_FLAGS,
    SCHED_POLICIES,
    Hook,
    Personality,
    Process,
    Seccomp,
)

# frontend.c's tables of fds, namespaces and cgroups, defined here alone: sandbox/executor/build.py
# writes them into the header frontend.c is built with (c_defines), so the two can never
# disagree (its other tables are as big as a plan asks: execve has the last word)
MAX_FDS = 64  # fds a plan carries
MAX_NS, MAX_CGROUPS = 8, 32
# bytes sent as one message (well inside a SOCK_SEQPACKET's send buffer): a plan, or the
# launcher's request, bigger than that goes in a memfd ("memfd", its fd first) of MAX_FILE at most
MAX_MESSAGE, MAX_FILE = 200_000, 64 << 20
# The words C and Python exchange beside the records, each defined here alone (c_defines:
# PLAN_READY ...): a created init is READY (process.c -> the gofer), which answers GO once
# the container is recorded; a foreground run's end is "STATUS N", N its wait status
# (frontend.c -> the server's child); MEMFD: a message whose first fd holds it (a plan, or
# the launcher's request, over MAX_MESSAGE).
READY, GO, STATUS, MEMFD = "ready", "g", "status", "memfd"


def c_defines() -> str:
    """The limits and words above and the console's deadline as C macros (PLAN_MAX_FDS ...,
    PLAN_READY ...), for the launcher and its executor."""
    words = (("READY", READY), ("GO", GO), ("STATUS", STATUS), ("MEMFD", MEMFD))  # (plain lowercase words)
    return "".join(f"#define PLAN_{name} {value}\n" for name, value in (
        ("MAX_FDS", MAX_FDS), ("MAX_NS", MAX_NS), ("MAX_CGROUPS", MAX_CGROUPS), ("MAX_MESSAGE", MAX_MESSAGE),
        ("MAX_FILE", MAX_FILE), ("CONSOLE_TIMEOUT_S", int(process.CONSOLE_TIMEOUT)),
        *((name, f'"{word}"') for name, word in words)))


def wait_status(report: bytes) -> int | None:
    """The wait status in a foreground run's "STATUS N" (frontend.c), or None for anything else."""
    head, _, number = report.partition(b" ")
    return int(number) if head == STATUS.encode() and number.isascii() and number.isdigit() else None


def process_records(proc: Process, personality: Personality | None = None, in_userns: bool = False) -> list[str]:
    """The process's credentials, capabilities as masks, umask, rlimits and scheduling (in a
    user namespace: no rlimits, and only the scheduling left for last; early_records)."""
    caps = proc.capabilities or process.NO_CAPABILITIES
    masks = [sum(1 << c for c in process._cap_numbers(getattr(caps, f), f))
             for f in ("bounding", "permitted", "inheritable", "effective", "ambient")]
    user = proc.user
    records = [f"nnp {int(proc.no_new_privileges)}", f"lastcap {process.LAST_CAP}",
               f"umask {user.umask if user.umask is not None else process.DEFAULT_UMASK}",
               f"codes {ProcessError.exit_code} {ExecError.exit_code} {BundleError.exit_code}", "caps " + " ".join(f"{m:x}" for m in masks),
               f"user {user.uid} {user.gid}", *(f"group {g}" for g in user.additional_gids)]
    if in_userns:
        return records + scheduling_records(proc, None, "late")
    return records + rlimit_records(proc) + scheduling_records(proc, personality)


def early_records(proc: Process, personality: Personality | None) -> list[str]:
    """With a user namespace, what takes the host's privileges (raising a hard limit, a
    real-time policy): set by the launcher's child before it enters the namespace (runc's
    nsexec order)."""
    return rlimit_records(proc) + scheduling_records(proc, personality, "early")


def rlimit_records(proc: Process) -> list[str]:
    # (the text after the numbers: what an error names, as gofer.process.set_rlimits does)
    return [f"rlimit {getattr(resource, rl.type)} {rl.soft} {rl.hard} [{i}]: {rl.type} soft {rl.soft} "
            f"hard {rl.hard}" for i, rl in enumerate(proc.rlimits)]


def scheduling_records(proc: Process, personality: Personality | None, part: str = "all") -> list[str]:
    """process.scheduler, process.ioPriority and linux.personality as the kernel takes them
    (gofer.process.set_scheduling's calls, its ``part``s; frontend.c makes them in the
    process that execs, or the early part before a user namespace)."""
    part_of = process.scheduling_part(proc, personality, part)
    if part_of is None:
        return []
    proc, personality = part_of
    records = []
    if (s := proc.scheduler) is not None:
        flags = sum(SCHED_FLAGS[f] for f in s.flags)
        records.append(f"sched {SCHED_POLICIES[s.policy]} {flags} {s.nice} {s.priority} {s.runtime} {s.deadline} "
                       f"{s.period}")
    if proc.io_priority is not None:
        records.append(f"ioprio {IOPRIO_CLASSES[proc.io_priority.class_]} {proc.io_priority.priority}")
    if personality is not None:
        records.append(f"personality {PERSONALITY_DOMAINS[personality.domain]}")
    return records


def seccomp_records(spec: Seccomp, no_new_privileges: bool) -> list[str]:
    """When the filter loads (before the user changes, where no_new_privs is off: it needs
    CAP_SYS_ADMIN then) and the spec's flags as seccomp(2) takes them; its fd follows."""
    flags = sum(SECCOMP_FLAGS[f] for f in spec.flags)
    return [f"seccomp {'late' if no_new_privileges else 'early'}", *([f"seccomp-flags {flags}"] if flags else [])]


def listener_records(spec: Seccomp, pid: int, state: dict) -> list[str]:
    """The message the agent is sent with the notification fd (gofer.seccomp.listener_message;
    the listener's connection follows), for frontend.c to send: the pid as the host sees it
    (0: exec's process, whose pid only the launcher learns) apart, the rest as it is."""
    from gofer.seccomp import listener_message

    head, rest = b'{"pid":0,', listener_message(spec, 0, state)
    assert rest.startswith(head)
    return [f"seccomp-listener {pid} {rest[len(head):].decode()}"]


# linux.seccomp.flags as seccomp(2)'s SECCOMP_FILTER_FLAG_* (gofer/seccomp.py gives libseccomp's names for them)
SECCOMP_FLAGS = {"SECCOMP_FILTER_FLAG_TSYNC": 1, "SECCOMP_FILTER_FLAG_LOG": 2, "SECCOMP_FILTER_FLAG_SPEC_ALLOW": 4}


def seccomp_memfd(bpf: bytes) -> int:
    """The filter, exported as BPF, in a memory file the front end reads."""
    memfd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
    os.write(memfd, bpf)
    return memfd


def label_records(proc: Process) -> list[str]:
    """The AppArmor profile and SELinux label the process execs into (gofer.process.apply_labels),
    written through the host's procfs, whose fd follows ("proc"): the container's /proc may
    be anything (CVE-2019-16884)."""
    records = [*([f"apparmor {proc.apparmor_profile}"] if proc.apparmor_profile else []),
               *([f"selinux {proc.selinux_label}"] if proc.selinux_label else [])]
    return [*records, "proc"] if records else []


def console_records(proc: Process) -> list[str]:
    """The --console-socket's connection (its fd follows) and the pty's size, for
    gofer.process.open_console's steps in frontend.c."""
    size = proc.console_size or {}
    return ["console", *([f"console-size {size.get('height', 0)} {size.get('width', 0)}"] if size else [])]


def hook_records(hooks: list[Hook], state: bytes) -> list[str]:
    """The startContainer hooks pid 1 runs after start, before its exec (gofer.hooks.run_hooks:
    the state on stdin, the hook's environment alone, "/" as cwd, umask 022, the timeout),
    and that state: "hook TIMEOUT PATH" (0: none), then its argv and environment."""
    records = [f"start-state {state.decode()}"]
    for hook in hooks:
        records.append(f"hook {hook.timeout or 0} {hook.path}")
        records += [f"hook-arg {a}" for a in hook.args or [hook.path]]
        records += [f"hook-env {k}={v}" for k, v in dict(e.partition("=")[::2] for e in hook.env).items()]
    return records


def command_records(proc: Process, entry: process.Entry) -> list[str]:
    """argv, and the environment with HOME as looked up."""
    return [f"arg {a}" for a in proc.args] + [f"env {k}={v}" for k, v in process.environment(proc, entry).items()]


def encode(records: list[str]) -> bytes:
    """The records as one message's bytes; a NUL in a value is refused (it would end it early)."""
    if any("\0" in r for r in records):
        raise SandboxError("process: a NUL in an argument, a variable or a hook (the launcher's plan cannot hold it)")
    return b"".join(os.fsencode(r) + b"\0" for r in records)


def send(sock, records: list[str], fds: list[int]) -> None:
    """The plan on ``sock``, its ``fds`` as SCM_RIGHTS: one message, or where it is bigger
    than MAX_MESSAGE, "memfd" with a memory file of the records as its first fd."""
    import socket

    data = encode(records)
    if len(fds) + 1 > MAX_FDS:
        raise SandboxError(f"process: more than {MAX_FDS - 1} fds for the launcher's plan")
    if len(data) <= MAX_MESSAGE:
        socket.send_fds(sock, [data], fds)
        return
    memfd = os.memfd_create("plan", os.MFD_CLOEXEC)
    try:
        os.write(memfd, data)  # (a memory file takes it whole)
        socket.send_fds(sock, [MEMFD.encode() + b"\0"], [memfd, *fds])
    finally:
        os.close(memfd)
