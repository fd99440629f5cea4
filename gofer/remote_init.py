"""Served create (sandbox/executor/create_plan.py): the container's init is the launcher's child
(sandbox/executor/frontend.c's init_process), pid 1 of its new pid namespace, so that it descends
from the engine's process (a subreaper waits for it), and no Python starts on the way.

The gofer, forked by the warm server's child, has the launcher make that process in the
spec's namespaces (``clone``), joins them and forks the process that builds the root from
inside them (``join``): procfs is mounted from inside the pid namespace, and pivot_root
moves pid 1's root along with its own. That process then hands pid 1 its process as
frontend.c's plan, and waits for it to be ready before it says Ready itself (``hand_over``).

    launcher (the engine's child)      gofer                       builder (G)
    "clone" records: ns fds, unshare
    flags, oom_score_adj  <----------  opened here
    setns, unshare, fork pid 1
    "pid N" + a channel to it ------>  setns into pid 1's, fork -> spec mounts, GPU mounts,
                                       exit                        pivot_root, masks
    pid 1  <------------------------------------------------------ the process's plan + exec.fifo
      rlimits, user, capabilities
      "ready" --------------------------------------------------->  Ready; Resume
      <----------------------------------------------------------   "g"
      wait on exec.fifo, then the rest of the tail, exec
"""

from __future__ import annotations

import os
import socket

from gofer import enter, process, rootfs, userns
from gofer import syscalls as sc
from gofer.frontend_plan import (
    GO,
    READY,
    command_records,
    console_records,
    early_records,
    hook_records,
    label_records,
    listener_records,
    process_records,
    seccomp_memfd,
    seccomp_records,
    send,
)
from mounts.errors import MountError, SandboxError
from mounts.proc import start_time
from mounts.spec import Spec


def clone(conn: socket.socket, spec: Spec, preserve_fds: int) -> tuple[int, socket.socket, int]:
    """Have the launcher make the container's pid 1: its pid (as the host sees it), our
    channel to it, and the namespace flags it unshared. The namespaces named by path are
    opened here, as the gofer would join them. With a user namespace (joined by path, or a
    new one with the spec's maps, which the launcher writes), the launcher's child sets what
    takes the host's privileges first (frontend.c's userns_init; gofer/userns.py in Python)."""
    flags, join = rootfs.namespace_flags(spec)
    in_userns, userns_path = userns.new_namespace(spec)
    if userns_path:
        join.insert(0, ("user", userns_path))
    elif in_userns:
        flags |= sc.CLONE_NEWUSER
    records = ["clone 1", f"preserve {preserve_fds}", f"unshare {flags}"]
    assert spec.process is not None
    if spec.process.oom_score_adj is not None:
        records.append(f"oom {spec.process.oom_score_adj}")
    if in_userns:
        records += early_records(spec.process, spec.linux.personality)
    if in_userns and not userns_path:
        records += [f"uid-map {userns.map_text(spec.linux.uid_mappings)}",
                    f"gid-map {userns.map_text(spec.linux.gid_mappings)}"]
    fds: list[int] = []
    try:
        for nstype, path in join:
            try:
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as e:
                raise MountError(path, f"linux.namespaces: cannot open the {nstype} namespace: {e.strerror}") from None
            records.append(f"ns {sc.NAMESPACES[nstype]} {nstype}")
        send(conn, records, fds)
    finally:
        for fd in fds:
            os.close(fd)
    report, got, _flags, _addr = socket.recv_fds(conn, 4096, 1, socket.MSG_CMSG_CLOEXEC)
    if not report:
        raise SandboxError("the launcher exited before it made the container's init")
    pid, error = enter.parse_report(report.decode(errors="replace"))
    if error is not None or len(got) != 1:
        for fd in got:
            os.close(fd)
        raise error or SandboxError("the launcher sent no channel to the container's init")
    assert pid is not None
    return pid, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=got[0]), flags


def join(init: int) -> None:
    """Into the cgroups of ``init`` (pid 1, the launcher's child: the container's, whose
    device rules and limits the builder then works under, as Python's gofer does) and every
    namespace of it that is not ours, then fork: the child, in its pid namespace too,
    returns; we exit (the supervisor hears from the child on the socket it inherits)."""
    for procs in _cgroup_procs(init):  # (before its cgroup namespace: the kernel checks a move against ours)
        try:
            os.write(procs, b"0")
        except OSError as e:
            raise SandboxError(f"the container's cgroup: cannot join it: {e.strerror}", op="cgroup") from None
        finally:
            os.close(procs)
    try:
        fds = enter.open_namespaces(init)
    except SandboxError:
        if start_time(init) is None:  # (killed before we could join it: say so, not which file was missing)
            raise SandboxError("the container's init exited before it was ready") from None
        raise
    try:
        for fd, flag, name in fds:
            sc.setns(fd, flag, what=f"the container's {name} namespace")
    finally:
        for fd, _, _ in fds:
            os.close(fd)
    if os.fork():
        os._exit(0)


def _cgroup_procs(init: int) -> list[int]:
    """The cgroup.procs files of ``init``'s cgroups, open for writing."""
    from gofer.cgroups.common import cgroup_dirs

    fds: list[int] = []
    for d in cgroup_dirs(init):
        try:
            fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError as e:
            for fd in fds:
                os.close(fd)
            raise SandboxError(f"{d}: cannot join the container's cgroup: {e.strerror}", op="cgroup", path=d) from None
    return fds


def shed_privileges(keep: set[int]) -> None:
    """Before Ready: from then on the container is recorded, processes can be exec'd into
    it, and they see this process in their pid namespace until it exits. It keeps nothing
    of the host's: every fd but ``keep`` (and stdio, the container's too) closed, every
    capability dropped, the bounding set with them, and no_new_privs."""
    import prctl

    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    for cap in range(process.LAST_CAP + 1):
        prctl.capbset_drop(cap)
    sc.capset(set(), set(), set())
    prctl.set_no_new_privs(1)


def hand_over(chan: socket.socket, init: int, spec: Spec, bpf: bytes | None, fifo: int,
              console: socket.socket | None, listener: tuple[socket.socket, dict] | None, state: bytes,
              in_userns: bool, ready) -> None:
    """Send pid 1 its process (looked up inside the root: cwd, HOME) and the startContainer
    hooks it runs after start with ``state`` on their stdin, wait until it is the
    container's user, let it go on to wait for start, then ``ready()`` (Ready, after which
    we exit: the supervisor records the container only once we are gone and reaped, so that
    no process exec'd into it finds us, in its pid namespace, to ptrace). Its error, if
    any, raised as its own. ``ready`` runs without privileges (shed_privileges)."""
    proc = spec.process
    assert proc is not None  # (create refuses a spec without one before this)
    entry = process.look_up(proc)
    # pivot_root took pid 1's root along only if it was the namespace's root (a launcher
    # chrooted, even into a bind of "/", would leave it the host's): pid 1 checks that its
    # root is ours ("root"), or nothing goes on (we could not look: in a user namespace its
    # /proc files are out of our reach)
    ours = os.stat("/")
    records = ["plan 1", f"root {ours.st_dev} {ours.st_ino}", *process_records(proc, spec.linux.personality, in_userns),
               "fifo"]
    fds = [fifo]
    try:
        records.append(f"cwd {proc.cwd}")
        fds.append(entry.cwd)
        if bpf is not None and spec.linux.seccomp is not None:
            fds.append(seccomp_memfd(bpf))
            records += seccomp_records(spec.linux.seccomp, proc.no_new_privileges)
            if listener is not None:  # (its connection and the state it is told)
                fds.append(listener[0].detach())
                records += listener_records(spec.linux.seccomp, init, listener[1])
        if labels := label_records(proc):  # (the host's procfs, ours till Ready)
            fds.append(os.dup(sc.PROC))
            records += labels
        if console is not None:
            fds.append(os.dup(console.fileno()))
            console.close()
            records += console_records(proc)
        hooks = spec.hooks.ours().start_container if spec.hooks is not None else []
        if hooks:
            records += hook_records(hooks, state)
        records += command_records(proc, entry)
        send(chan, records, fds)
    finally:
        for fd in fds[1:]:
            os.close(fd)
    os.close(fifo)  # (pid 1 has it)
    report = chan.recv(4096).decode(errors="replace")
    if not report.startswith(READY):
        _pid, error = enter.parse_report(report)
        raise error or SandboxError("the container's init exited before it was ready")
    chan.send(GO.encode())  # (should the create fail from here on, the supervisor kills pid 1)
    chan.close()
    ready()
