"""The gofer: a small synchronous program that builds the container's root and execs it.

It runs in a child of the supervisor (forked before the supervisor imports its event loop),
reads frames from its end of the socketpair, and follows a fixed sequence; see
gofer/protocol.py for the exchange and docs/design.md for the overall picture.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import msgspec
import prctl

from gofer import gpu, process, protocol, remote_init, rootfs, seccomp, userns
from gofer import syscalls as sc
from gofer.cgroups import Pinned, own_cgroups
from gofer.hooks import run_hooks
from gofer.hooks import state as hook_state
from gofer.root import Root
from gofer.spans import Spans
from mounts import actions as A
from mounts.errors import SandboxError
from mounts.proc import exit_code

# After pivot_root nothing can be imported (the container has no Python): import up front.
_traceback = __import__("traceback") if os.environ.get("SANDBOX_DEBUG") else None


class GoferError(SandboxError):
    """The conversation with the supervisor went wrong (EOF, a frame out of order)."""


def _expect_start(sock: socket.socket) -> protocol.Start:
    msg = protocol.recv_request(sock)
    if not isinstance(msg, protocol.Start):
        raise GoferError(f"expected Start, got {type(msg).__name__ if msg else 'EOF'}")
    return msg


_GROUP = {"symlink": "libraries", "library": "libraries", "device": "devices", "binary": "binaries",
          "firmware": "firmware", "ipc": "ipc", "config": "config files", "procfs": "procfs",
          "ldcache": "ld.so.cache"}


def _gpu_requests(sock: socket.socket, root: Root, spans: Spans) -> int:
    """Apply requests as they arrive until End; one span per run of the same group.
    The time spent waiting for the next frame is part of the span (it shows streaming)."""
    n = count = 0
    group, t0 = None, time.monotonic_ns()
    while True:
        msg = protocol.recv_request(sock)
        if msg is None:
            raise GoferError("supervisor closed the socket before End")
        if isinstance(msg, protocol.End):
            if group is not None:
                spans.add(f"gpu {group}", t0, count=count)
            return n
        if not isinstance(msg, A.Action):
            raise GoferError(f"unexpected {type(msg).__name__} frame during GPU setup")
        if _GROUP[msg.kind] != group:
            if group is not None:
                spans.add(f"gpu {group}", t0, count=count)
            group, t0, count = _GROUP[msg.kind], time.monotonic_ns(), 0
        gpu.apply(root, msg)
        n += 1
        count += 1


ORPHANED = signal.SIGRTMIN + 1  # our PDEATHSIG while we wait: no signal anyone forwards


class Leftovers:
    """What a foreground run leaves should its supervisor die: the cgroups it made and its
    state directory, held by fds opened while the host's paths are ours to walk (pid 1's
    pivot_root in the mount namespace we share takes them from our view)."""

    def __init__(self, cgroups: list[str], state_dir: str | None):
        self.cgroups = Pinned(cgroups) if cgroups else None
        self.state = None
        if state_dir is not None:
            parent = os.open(os.path.dirname(state_dir), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            name = os.path.basename(state_dir)
            self.state = (parent, name, os.stat(name, dir_fd=parent, follow_symlinks=False).st_ino)

    def close(self) -> None:
        """In the forked init, which must not keep them."""
        if self.cgroups is not None:
            self.cgroups.close()
        if self.state is not None:
            os.close(self.state[0])

    def remove(self) -> None:
        if self.cgroups is not None:
            self.cgroups.remove()
        if self.state is None:
            return
        parent, name, ino = self.state
        try:  # only the directory we were handed: a later run of the id may have replaced it
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError:
            return
        try:
            if os.fstat(fd).st_ino != ino:
                return
            for entry in os.listdir(fd):
                os.unlink(entry, dir_fd=fd)
            os.rmdir(name, dir_fd=parent)
        except OSError:
            pass
        finally:
            os.close(fd)


def _wait_pid1(child: int, parent: int, pinned: Leftovers | None) -> None:
    """We are the parent of the container's pid 1: forward signals, exit as it exits. Should
    our supervisor die (SIGKILL), the kernel tells us with ORPHANED: then the container goes
    too, and with it the cgroup and the state the supervisor made, which nobody else would
    remove."""
    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    def orphaned(_signum, _frame):
        try:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        if pinned is not None:
            pinned.remove()
        os._exit(137)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    signal.signal(ORPHANED, orphaned)
    prctl.set_pdeathsig(ORPHANED)
    if os.getppid() != parent:  # it died before the new PDEATHSIG was set
        orphaned(ORPHANED, None)
    _, status = os.waitpid(child, 0)
    # Killed by signal N: exit 128+N, the status runc reports. Re-raising the signal on
    # ourselves instead would dump our core for SIGSEGV and do nothing for signals whose
    # default is to be ignored. (exit_code imported at the top: after pivot_root nothing can be)
    os._exit(exit_code(status))


def run(sock: socket.socket, t_spawn: int, parent: int) -> None:
    """The whole sequence; raises on any failure (the caller reports it and exits)."""
    prctl.set_name("sandbox-gofer")
    # Not dumpable until the container's program is exec'd (execve resets it): no process of
    # the container may open our /proc/<pid>/exe (the host's Python, to be overwritten as in
    # CVE-2019-5736), our fds or our memory while we are the host's interpreter in its pid
    # namespace, waiting on exec.fifo as a created init above all.
    prctl.set_dumpable(False)
    # Our caller's umask must not shape what we create (device nodes are 0666, mount
    # points 0644/0755); the container gets the spec's umask or runc's 0022 at exec.
    os.umask(0)
    # PDEATHSIG first: if the supervisor dies from here on, we die with it; if it died
    # before (we were reparented), stop now.
    prctl.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:
        raise GoferError("the supervisor exited before the gofer started")
    start = _expect_start(sock)
    # Nothing the caller left open may reach the container (runc closes them too), except
    # the --preserve-fds ones: every other fd above stderr is closed now, before any
    # namespace is joined (pid 1 waits for start in there, where a ptracer could take an fd
    # it holds), and nothing of the caller's command line or environment stays in memory.
    keep = {sock.fileno(), sc.PROC} | ({start.launcher_fd} if start.launcher_fd is not None else set())
    sc.close_fds(3 + (start.preserve_fds if start.launcher_fd is None else 0), keep)  # (served: the launcher's are the engine's)
    if start.launcher_fd is None:  # (served: pid 1 is the launcher's child, which blanks its own)
        sc.hide_caller()
    spans = Spans(start.trace, os.getpid())
    spans.add("gofer:start", t_spawn)
    spec = start.spec
    if spec.process is None:  # the supervisor refuses such a bundle; never mount for nothing
        raise GoferError("config.json: no process to run")
    process.check_labels(spec.process, spec.linux.mount_label)
    hooks = spec.hooks.ours() if spec.hooks is not None else None
    if hooks is not None and (hooks.create_container or hooks.start_container):
        import subprocess  # noqa: F401 - imported from the host's tree, before any namespace is joined

    if spec.process.oom_score_adj is not None and start.launcher_fd is None:  # (served: the launcher's to write)
        with open("/proc/self/oom_score_adj", "w") as f:  # inherited by the container's process
            f.write(str(spec.process.oom_score_adj))
    # Host-side things the init needs later are taken now, before any namespace is joined (a
    # mount namespace named by path would resolve them in another tree) or pivot_root.
    fifo = os.open(start.exec_fifo, os.O_RDWR | os.O_CLOEXEC) if start.exec_fifo else None
    console = process.connect_console(start.console_socket) if start.console_socket else None
    # libseccomp is a host library: load it and build the filter here
    filt = bpf = listener = None
    if spec.linux.seccomp is not None:
        with spans.span("seccomp compile", rules=len(spec.linux.seccomp.syscalls)):
            if start.launcher_fd is not None:  # (libseccomp is a host library: export it now)
                bpf = seccomp.export(spec.linux.seccomp)
                listener = seccomp.connect_listener(spec.linux.seccomp)
            else:
                filt = seccomp.Filter(spec.linux.seccomp)
    in_userns, userns_path = userns.new_namespace(spec)
    sources = None
    if in_userns and start.launcher_fd is None:  # (served: the launcher's child enters it, frontend.c)
        # raising a hard limit or a real-time policy takes the host's privileges: now, then
        process.set_rlimits(spec.process)
        process.set_scheduling(spec.process, spec.linux.personality, "early")
        parent = _keeper(sock, start, parent, userns_path)  # returns in the namespace, as the host's uid
        # Our mount namespace now, a copy of the host's that the kernel locks (a container's
        # root may not remount a read-only bind rw, nor lift a mount to see what it covers):
        # the bind sources are cloned from it, keeping the locks, while we can still walk
        # the host's paths as its uid 0 (a 0700 directory of root's).
        sc.unshare(sc.CLONE_NEWNS)
        sources = rootfs.clone_bind_sources(spec, start.bundle)
        userns.become_root()
        if not start.detached:
            prctl.set_pdeathsig(signal.SIGKILL)  # (a change of credentials clears it)
    chan = None
    if start.launcher_fd is not None:  # served create: pid 1 is the launcher's child
        t = time.monotonic_ns()
        init, chan, unshared = remote_init.clone(socket.socket(fileno=start.launcher_fd), spec, start.preserve_fds)
        cgroups = own_cgroups(init) if any(m.type == "cgroup" for m in spec.mounts) else {}
        remote_init.join(init)  # its child from here on, in its namespaces
        if in_userns:  # the host's uid still, in the container's user and mount namespaces: see above
            sources = rootfs.clone_bind_sources(spec, start.bundle)
            userns.become_root()
        if unshared & sc.CLONE_NEWNET:
            sc.loopback_up()
        host_pid = spans.pid = init
        spans.add("clone pid 1", t)
    else:
        host_pid, cgroups = _enter(spec, start, sock, parent, in_userns, spans)

    if not in_userns:  # (before prepare_root: see clone_bind_sources)
        sources = rootfs.clone_bind_sources(spec, start.bundle, shared_only=True)
    with spans.span("rootfs"):
        # In a user namespace the image's files stay the host's (nobody's, in there): no
        # overlay of the whole root, whose directories root in there could not write, but
        # one per directory that gains an entry, as embedded in another runtime.
        root = rootfs.prepare_root(spec, start.rootfs, start.overlay_root and not in_userns, start.scratch_size,
                                   in_userns)
    with spans.span("spec mounts", count=len(spec.mounts)):
        rootfs.spec_mounts(root, spec, start.bundle, sources, cgroups)
    with spans.span("devices"):
        rootfs.make_devices(root, spec.linux.devices, bind=in_userns)
        rootfs.ensure_cwd(root, spec.process.cwd)
    with spans.span("gpu mounts") as s:
        s.args["requests"] = _gpu_requests(sock, root, spans)
        s.args["overlays"] = len(root.overlays)
        s.args["created"] = root.created
    # the state hooks read on stdin (built before pivot_root: nothing to import after), and
    # what a seccomp agent is told with the notification fd
    status = hook_state(start.id, "creating", host_pid, start.bundle, start.spec.annotations)
    state = msgspec.json.encode(status)
    # the startContainer hooks' (after start, as runc's init tells them: "created")
    started = msgspec.json.encode(hook_state(start.id, "created", host_pid, start.bundle, start.spec.annotations))
    if filt is not None:
        filt.pid, filt.state = host_pid, status
    if start.hooks_pause:
        # prestart and createRuntime run in the runtime's namespaces: the supervisor runs them
        # while we wait here, after the mounts and before pivot_root.
        with spans.span("runtime hooks"):
            protocol.send(sock, protocol.Paused(host_pid))
            if not isinstance(protocol.recv_request(sock), protocol.Resume):
                raise GoferError("supervisor gave up during the createRuntime hooks")
    if hooks is not None and hooks.create_container:
        with spans.span("createContainer hooks"):
            run_hooks(hooks.create_container, "createContainer", state)
    with spans.span("pivot_root"):
        rootfs.pivot(root)
    with spans.span("masks"):
        rootfs.write_sysctls(spec.linux.sysctl)  # (before readonlyPaths close /proc/sys)
        rootfs.mask_and_protect(spec)
        if spec.root.readonly:
            rootfs.readonly_root(root)
        if spec.hostname and any(ns.type == "uts" for ns in spec.linux.namespaces):
            socket.sethostname(spec.hostname)
        rootfs.propagate_root(spec)
    root.close()

    proc = spec.process
    t_user = time.monotonic_ns()

    def ready() -> None:
        """Between the user change and exec: Ready, and for create the wait for start."""
        spans.add("user", t_user)
        # Ready makes us visible to the container's other processes (exec's), in a joined pid
        # namespace we were from the fork (as runc's init is, its root the host's until
        # pivot_root): no fd of ours may lead to the host from here on.
        sc.leave_host_proc()
        spans.add("exec", time.monotonic_ns())
        if start.detached:
            prctl.set_pdeathsig(0)  # before Ready: the supervisor exits as soon as it reads it
        protocol.send(sock, protocol.Ready(spans.items, host_pid))
        if fifo is not None:
            # create: the supervisor records our pid, then says Resume; EOF instead means it
            # died before any state names us, so nobody could ever start or delete us: give up.
            if not isinstance(protocol.recv_request(sock), protocol.Resume):
                raise GoferError("the supervisor exited before recording the container")
            sock.close()
            # Wait for start. The FIFO is open read-write, so this read blocks until `sandbox
            # start` writes its byte (no writer-less EOF can end it early).
            os.read(fifo, 1)
            os.close(fifo)
            global _started
            _started = True

    if chan is not None:  # served create: pid 1 runs the tail (sandbox/frontend.c)
        assert fifo is not None

        def remote_ready() -> None:
            spans.add("user", t_user)
            sc.leave_host_proc()
            assert chan is not None
            remote_init.shed_privileges({sock.fileno()})  # (chan: handed over and closed)
            spans.add("exec", time.monotonic_ns())
            protocol.send(sock, protocol.Ready(spans.items, host_pid))  # (and we exit: see hand_over)

        remote_init.hand_over(chan, init, spec, bpf, fifo, console, (listener, status) if listener else None, started,
                              in_userns, remote_ready)
        os._exit(0)
    start_hooks = None
    if hooks is not None and hooks.start_container:
        def start_hooks() -> None:
            run_hooks(hooks.start_container, "startContainer", started)
    # (in a user namespace of its own, the rlimits and the early scheduling came before it,
    # with the host's privileges: see the _keeper call above)
    process.tail(proc, console, spec.linux.personality, "late" if in_userns else "all", filt,
                 rlimits=not in_userns, ready=ready, pdeathsig=not start.detached, before_exec=start_hooks)


def _enter(spec, start: protocol.Start, sock: socket.socket, parent: int, in_userns: bool,
           spans: Spans) -> tuple[int, dict[str, str]]:
    """Into the spec's namespaces; in a new pid namespace, fork its pid 1 and go on as it (the
    parent stays to wait for it, or exits for create). Returns (our pid as the host sees it,
    the container's cgroups for a cgroup mount)."""
    # the container's cgroups (we are in them), read before a cgroup namespace hides them
    cgroups = own_cgroups() if any(m.type == "cgroup" for m in spec.mounts) else {}
    with spans.span("unshare"):
        flags, joined = rootfs.enter_namespaces(spec, done=sc.CLONE_NEWNS if in_userns else 0)
        if flags & sc.CLONE_NEWNET:
            sc.loopback_up()
    new_pid = (flags | joined) & sc.CLONE_NEWPID
    if new_pid:
        # A new pid namespace applies to children: fork its pid 1 now, before any mount, so
        # that procfs is mounted from inside the namespace it should show.
        t = time.monotonic_ns()
        # pid 1 will pivot_root in the mount namespace we share, which detaches the host's
        # cgroup mounts from our view, perhaps before we run again after the fork: hold what
        # we would remove by fds opened first. (In a user namespace the keeper above us
        # removes the cgroups: we cannot.)
        pinned = None if in_userns or start.detached else Leftovers(start.cgroup_created, start.state_dir)
        child = process.fork_in_cgroup(spec, "pid 1")
        if child:
            sock.close()
            if start.detached:  # create: the init outlives us; the caller (a subreaper) reaps it
                os._exit(0)
            _wait_pid1(child, parent, pinned)
        if pinned is not None:
            pinned.close()
        if not start.detached:
            prctl.set_pdeathsig(signal.SIGKILL)
    host_pid = spans.pid = _host_pid()  # read while /proc is still the host's
    if new_pid:
        spans.add("fork pid 1", t)
    return host_pid, cgroups


def _keeper(sock: socket.socket, start: protocol.Start, parent: int, path: str | None) -> int:
    """Split for the container's user namespace (gofer/userns.py): we stay outside as its
    keeper and never return; the child returns inside it, still the host's uid until it
    becomes root in there, with the keeper's pid (its parent now)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = os.fork()
    if child == 0:
        ours.close()
        keeper = os.getppid()
        if not start.detached:
            prctl.set_pdeathsig(signal.SIGKILL)
        userns.enter(path, theirs)
        if not start.detached and os.getppid() != keeper:  # (detached, the keeper exits now)
            raise GoferError("the gofer exited before the user namespace was made")
        return keeper
    theirs.close()
    if ours.recv(1) == b"u":
        try:
            if path is None:
                userns.write_maps(child, start.spec)
        except SandboxError as e:
            os.kill(child, signal.SIGKILL)
            protocol.send(sock, protocol.error_frame(e))
            os._exit(e.exit_code)
        ours.send(b"m")
    ours.close()
    sock.close()  # the child speaks for the container from here on
    if start.detached:  # the init outlives us, as in create without a user namespace
        os._exit(0)
    # outside the user namespace and the container's mount namespace, we can remove them
    _wait_pid1(child, parent, Leftovers(start.cgroup_created, start.state_dir))
    raise AssertionError("unreachable")


def _host_pid() -> int:
    """Our pid as the supervisor sees it (differs from getpid() inside a new pid namespace)."""
    try:
        with open("/proc/thread-self/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return os.getpid()


def serve_fd(fd: int, t_spawn: int, parent: int) -> None:
    """serve() in a fresh interpreter (gofer/fresh.py: sandbox/fork.py's child), its end of
    the socketpair inherited as ``fd``: never returns."""
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    serve(sock, t_spawn, parent)


def serve(sock: socket.socket, t_spawn: int, parent: int) -> None:
    """Entry point in the forked child of ``parent`` (the supervisor): never returns."""
    code = 1
    try:
        run(sock, t_spawn, parent)
    except BaseException as e:  # report every failure as one line, then exit
        if _traceback is not None:
            _traceback.print_exc()
        frame = protocol.error_frame(e)
        code = frame.code
        if _started:
            # no supervisor to tell (a created init failing after start): the container's
            # stderr, where the engine's log is, gets the line instead
            os.write(2, f"sandbox: {frame.message}\n".encode(errors="replace"))
        else:
            try:
                protocol.send(sock, frame)
            except OSError:
                pass  # the supervisor gave up first and says why itself
    os._exit(code)


_started = False  # a created init past `sandbox start`: its supervisor is long gone
