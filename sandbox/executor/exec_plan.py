"""`sandbox exec` with the warm server: the server's child runs the verb's Python (the command
line, the state, the bundle, the process and every check, as the exec verb does) and, in place of
gofer/enter.py's fork, sends the launcher a plan that its C front end (sandbox/executor/frontend.c)
carries out: the process must descend from the engine's own (a subreaper waits for it), so
only the launcher's process may fork it. Python starts nowhere on the container's path.

The plan is NUL-terminated "KEY VALUE" records with the fds they name (SCM_RIGHTS, in
order): the namespaces' fds, opened through one pinned /proc/<init> as spawn opens them; the
cgroups' cgroup.procs files; the cwd, resolved inside the container's root (its mount
namespace entered and left again here); the seccomp filter, compiled by libseccomp and
exported as BPF, its flags and its agent's connection; the --console-socket's connection;
the LSM labels with our procfs; rlimits, scheduling and the personality, capabilities as
masks, the user, umask, argv and the environment with HOME. The front end answers with
gofer/enter.py's report ("pid N", "err CODE MESSAGE"), read here with the same code, so the
errors are the same lines. A process of any size is planned (gofer/frontend_plan.send: in a
memfd where one message cannot hold it)."""

from __future__ import annotations

import os
import socket

from gofer import enter, process
from gofer import frontend_plan as fp
from gofer import syscalls as sc
from gofer.seccomp import connect_listener, export
from mounts.errors import SandboxError
from mounts.spec import OCI_VERSION, Personality, Process, Seccomp


class Decline(Exception):
    """Not for the front end: the launcher runs the verb in Python (nothing has happened yet)."""


class Frontend:
    """gofer.enter.spawn's stand-in in the server's child: the same arguments, the same pid
    or the same SandboxError."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.planned = False

    def spawn(self, init: int, proc: Process, console=None, preserve_fds: int = 0, detach: bool = False,
              seccomp: Seccomp | None = None, cgroups=(), start_time: int | None = None,
              personality: Personality | None = None) -> int:
        process.check_labels(proc)  # (as Python's exec: one that would not apply is refused)
        records = ["plan 1", f"detach {int(detach)}", f"preserve {preserve_fds}", *fp.process_records(proc, personality)]
        fds = enter.open_namespaces(init, start_time)
        sent: list[int] = []
        try:
            for fd, flag, name in fds:
                records.append(f"ns {flag} {name}")
                sent.append(fd)
            for d in cgroups:
                sent.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
                records.append(f"cgroup {d}")
            entry = _look_up(proc, next(fd for fd, _, name in fds if name == "mnt"))
            sent.append(entry.cwd)
            records.append(f"cwd {proc.cwd}")
            if seccomp is not None:
                sent.append(fp.seccomp_memfd(export(seccomp)))
                records += fp.seccomp_records(seccomp, proc.no_new_privileges)
                listener = connect_listener(seccomp)
                if listener is not None:  # (the pid is the launcher's to fill in: its child's)
                    sent.append(listener.detach())
                    records += fp.listener_records(seccomp, 0, {"ociVersion": OCI_VERSION, "status": "running",
                                                                "pid": init})
            if labels := fp.label_records(proc):  # (the host's procfs: ours, the caller's mount namespace)
                sent.append(os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
                records += labels
            if console is not None:  # (the launcher's copy is the one that stays)
                sent.append(os.dup(console.fileno()))
                console.close()
                records += fp.console_records(proc)
            records += fp.command_records(proc, entry)
            self.conn.settimeout(None)  # (the request's deadline is over; the report comes at exec)
            fp.send(self.conn, records, sent)
            self.planned = True
        finally:  # (the launcher has its own copies of what was sent)
            for fd in {*sent, *(fd for fd, _, _ in fds)}:
                os.close(fd)
        report = self.conn.recv(65536)
        if not report:
            raise SandboxError("the launcher exited before it reported the process")
        pid, error = enter.parse_report(report.decode(errors="replace"))
        if error is not None:
            raise error
        assert pid is not None  # (parse_report gives one or the other)
        return pid


def _look_up(proc: Process, mnt: int) -> process.Entry:
    """process.look_up inside the container's root: its mount namespace, entered and left
    (a forked child of the server, single-threaded), the cwd left unentered."""
    own = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sc.setns(mnt, sc.CLONE_NEWNS, what="the container's mnt namespace")
        try:
            return process.look_up(proc)
        finally:
            sc.setns(own, sc.CLONE_NEWNS, what="our own mnt namespace")
            os.fchdir(here)
    finally:
        os.close(own)
        os.close(here)
