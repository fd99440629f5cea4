"""A new process inside a running container (``sandbox exec``): join every namespace of its
init, then set the process up exactly as the init was (gofer/process.py) and exec.

::

    sandbox exec (P)             child (C)                      process (G)
    ----------------             ---------                      -----------
    subreaper (unless -d)
    fork ------------------->    cgroups, rlimits, scheduling
                                 setns user (first: it owns
                                 the others), ipc, uts, net,
                                 pid, cgroup, then mnt (our
                                 root becomes the container's)
                                 fork ----------------------->  pty, user, caps,
                  <-- "pid N" -- exit 0                         umask, cwd, env, exec
    reap C; G is now ours
                  <---------------------- EOF (exec'd) or "err CODE MESSAGE" --

The pid namespace applies to children only, hence C forks G. With --detach P returns once G
exec'd and G is left to P's caller (a subreaper such as conmon); without it P reaps G.
"""

from __future__ import annotations

import os
import socket

import msgspec
import prctl

from gofer import process
from gofer import syscalls as sc
from gofer.seccomp import Filter
from mounts.errors import SandboxError
from mounts.proc import start_time as _start_time
from mounts.spec import OCI_VERSION, Personality, Process, Seccomp

# user first: in it we hold the privileges over the namespaces it owns, and no other (so the
# cgroups, rlimits and scheduling come before it). mnt last: joining it moves our root and
# cwd into the container, after which the host's /proc/<pid>/ns files are out of reach (all
# fds are opened first anyway).
NAMESPACES = (("user", sc.CLONE_NEWUSER), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS), ("net", sc.CLONE_NEWNET),
              ("pid", sc.CLONE_NEWPID), ("cgroup", sc.CLONE_NEWCGROUP), ("mnt", sc.CLONE_NEWNS))


def open_namespaces(init: int, start_time: int | None = None) -> list[tuple[int, int, str]]:
    """(fd, CLONE_NEW*, name) of every namespace of ``init`` that is not ours, in joining
    order. Everything through one fd of /proc/<init>: should the pid be reused meanwhile,
    reads through it fail instead of reaching another process. The start time is checked
    through it after the namespaces are open, and a container always has a mount namespace
    of its own: one equal to ours is not our container's init."""
    fds = []
    try:
        pdir = os.open(f"/proc/{init}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name, flag in NAMESPACES:
                if os.stat(f"ns/{name}", dir_fd=pdir).st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
                    fds.append((os.open(f"ns/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=pdir), flag, name))
                elif name == "mnt":
                    raise SandboxError(f"pid {init} shares our mount namespace: it is not the container's init")
            if start_time is not None and _start_time(init, pdir) != start_time:
                raise SandboxError(f"pid {init} is no longer the container's init")
        finally:
            os.close(pdir)
    except (OSError, SandboxError) as e:
        for fd, _, _ in fds:
            os.close(fd)
        if isinstance(e, SandboxError):
            raise
        raise SandboxError(f"pid {init}: cannot open its namespaces: {e.strerror}") from None
    return fds


def parse_report(report: str) -> tuple[int | None, SandboxError | None]:
    """The child's report ("pid N", then nothing or "err CODE MESSAGE"; sandbox/frontend.c
    writes the same): G's pid, and the error that kept it from exec'ing."""
    pid = None
    for line in report.splitlines():
        word, _, rest = line.partition(" ")
        if word == "pid":
            pid = int(rest)
        elif word == "err":
            code, _, message = rest.partition(" ")
            return pid, SandboxError(message, code=int(code))
    if pid is None:
        return None, SandboxError("the process could not be started in the container's namespaces")
    return pid, None


def spawn(init: int, proc: Process, console: socket.socket | None = None, preserve_fds: int = 0,
          detach: bool = False, seccomp: Seccomp | None = None, cgroups: list[str] | tuple[str, ...] = (),
          start_time: int | None = None, personality: Personality | None = None) -> int:
    """Start ``proc`` in the namespaces of ``init``; returns its pid (as the host sees it)
    once it has exec'd. Raises a one-line SandboxError if it could not."""
    fds = open_namespaces(init, start_time)
    if not detach:
        prctl.set_child_subreaper(1)  # G becomes ours when C exits
    r, w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        os.close(r)
        _fresh_child(ChildStart(fds, proc, console.fileno() if console is not None else None, preserve_fds, w,
                                seccomp, list(cgroups), personality, init))  # never returns
    os.close(w)
    for fd, _, _ in fds:
        os.close(fd)
    if console is not None:
        console.close()
    with os.fdopen(r, "rb") as f:
        report = f.read()
    os.waitpid(child, 0)
    pid, error = parse_report(report.decode(errors="replace"))
    if error is not None:
        if pid is not None:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        raise error
    assert pid is not None
    return pid


class ChildStart(msgspec.Struct, frozen=True):
    """What C is told, as it becomes a fresh interpreter (gofer/fresh.py): the fds by number."""

    namespaces: list[tuple[int, int, str]]  # (fd, CLONE_NEW*, name)
    proc: Process
    console: int | None
    preserve_fds: int
    report: int
    seccomp: Seccomp | None
    cgroups: list[str]
    personality: Personality | None
    init: int


def _fresh_child(start: ChildStart) -> None:
    """C, forked from `sandbox exec` (which holds its caller's command line, parsed): a fresh
    interpreter first, so that nothing of it is in G's memory while G sits in the container's
    pid namespace, where a ptracer could read it. Its start in a memfd. Never returns."""
    from gofer.fresh import exec_fresh

    try:
        memfd = os.memfd_create("sandbox-exec", os.MFD_CLOEXEC)
        os.write(memfd, msgspec.msgpack.encode(start))
        fds = (memfd, start.report, *(fd for fd, _, _ in start.namespaces),
               *((start.console,) if start.console is not None else ()))
        exec_fresh(f"from gofer.enter import child_main; child_main({memfd})", fds)
    finally:
        os._exit(1)


def child_main(memfd: int) -> None:
    """C in its fresh interpreter: read what it was told, then on as before. Never returns."""
    data = os.pread(memfd, 1 << 26, 0)
    os.close(memfd)
    start = msgspec.msgpack.decode(data, type=ChildStart)
    for fd in (start.report, *(fd for fd, _, _ in start.namespaces)):
        os.set_inheritable(fd, False)
    console = socket.socket(fileno=start.console) if start.console is not None else None
    if console is not None:
        console.set_inheritable(False)
    _child(start.namespaces, start.proc, console, start.preserve_fds, start.report, start.seccomp, start.cgroups,
           start.personality, start.init)


def _child(fds, proc: Process, console, preserve_fds: int, w: int, seccomp: Seccomp | None,
           cgroups: list[str] | tuple[str, ...], personality: Personality | None, init_pid: int) -> None:
    code = 1
    try:
        prctl.set_dumpable(False)  # as the gofer: see gofer/main.py (CVE-2019-5736)
        process.check_labels(proc)
        # before setns (the fallback lists /proc/self/fd), and before G is forked into the
        # container's pid namespace: nothing of the caller's but stdio and the preserved fds
        keep = {w, sc.PROC, *(fd for fd, _, _ in fds)} | ({console.fileno()} if console is not None else set())
        sc.close_fds(3 + preserve_fds, keep)
        sc.hide_caller()
        for d in cgroups:  # the container's cgroups, limits and device rules, before anything else
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        # the container's filter too, built while libseccomp (a host library) is reachable
        filt = Filter(seccomp) if seccomp is not None else None
        # with the host's privileges still ours (a user namespace takes them): raising a
        # hard limit, a real-time policy; the fork below inherits them
        process.set_rlimits(proc)
        process.set_scheduling(proc, personality, "early")
        for fd, flag, name in fds:
            sc.setns(fd, flag, what=f"the container's {name} namespace")
            os.close(fd)
        # what the process takes from the image, read as root (and the cwd entered, which G
        # inherits) while our procfs is the host's: G is the container's to see from its
        # fork on, and must not have it
        entry = process.look_up(proc)
        sc.leave_host_proc()
        tell_r, tell_w = os.pipe2(os.O_CLOEXEC) if filt is not None and filt.listener else (None, None)
        pid = os.fork()
        if pid:
            os.write(w, f"pid {pid}\n".encode())
            if tell_w is not None:  # the pid a seccomp agent needs is the host's: only we see it
                os.write(tell_w, str(pid).encode())
            os._exit(0)
        if tell_r is not None and filt is not None:  # (tell_r is only made with a filt)
            filt.pid = int(os.read(tell_r, 32))
            filt.state = {"ociVersion": OCI_VERSION, "status": "running", "pid": init_pid}
        # SCHED_DEADLINE ("late") forbids our fork: the rest of the scheduling came before it
        process.tail(proc, console, personality, "late", filt, entry=entry, pdeathsig=False)
    except BaseException as e:
        msg = str(e) or type(e).__name__
        code = e.exit_code if isinstance(e, SandboxError) else 1
        try:
            os.write(w, f"err {code} {' '.join(msg.split())}\n".encode())
        except OSError:
            pass
    os._exit(code)
