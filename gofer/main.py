"""The gofer: a small synchronous program that builds the container's root.

It runs in a child of the supervisor (the server's child that plans the verb), reads frames
from its end of the socketpair, has the launcher make pid 1 (gofer/remote_init.py), builds
the root from inside its namespaces and hands pid 1 its process; see gofer/protocol.py for
the exchange and docs/design.md for the overall picture.
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
from gofer.cgroups import own_cgroups
from gofer.hooks import run_hooks
from gofer.hooks import state as hook_state
from gofer.root import Root
from gofer.spans import Spans
from mounts import actions as A
from mounts.errors import SandboxError

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


def run(sock: socket.socket, t_spawn: int, parent: int) -> None:
    """The whole sequence; raises on any failure (the caller reports it and exits)."""
    prctl.set_name("sandbox-gofer")
    # Not dumpable: no process of the container may open our /proc/<pid>/exe, our fds or our
    # memory while our builder is the host's interpreter in its pid namespace.
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
    # Nothing but our socket, the launcher's and our procfs: the engine's fds are the
    # launcher's to pass on (--preserve-fds), never ours.
    sc.close_fds(3, {sock.fileno(), sc.PROC, start.launcher_fd})
    spans = Spans(start.trace, os.getpid())
    spans.add("gofer:start", t_spawn)
    spec = start.spec
    if spec.process is None:  # the supervisor refuses such a bundle; never mount for nothing
        raise GoferError("config.json: no process to run")
    process.check_labels(spec.process, spec.linux.mount_label)
    hooks = spec.hooks.ours() if spec.hooks is not None else None
    taken = _from_the_host(start, hooks, spans)
    in_userns, _path = userns.new_namespace(spec)
    # pid 1 is the launcher's child, made in the container's namespaces (gofer/remote_init.py)
    t = time.monotonic_ns()
    init, chan, unshared = remote_init.clone(socket.socket(fileno=start.launcher_fd), spec, start.preserve_fds)
    cgroups = own_cgroups(init) if any(m.type == "cgroup" for m in spec.mounts) else {}
    remote_init.join(init)  # its child from here on, in its namespaces
    if in_userns:
        # the host's uid still, in the container's user and mount namespaces (a copy of the
        # host's that the kernel locks: a container's root may not remount a read-only bind
        # rw, nor lift a mount to see what it covers): the bind sources are cloned from it,
        # keeping the locks, while we can still walk the host's paths as its uid 0
        sources = rootfs.clone_bind_sources(spec, start.bundle)
        userns.become_root()
    else:  # (before prepare_root: see clone_bind_sources)
        sources = rootfs.clone_bind_sources(spec, start.bundle, shared_only=True)
    if unshared & sc.CLONE_NEWNET:
        sc.loopback_up()
    spans.pid = init
    spans.add("clone pid 1", t)
    root = _build(sock, start, sources, cgroups, in_userns, spans)
    # the state hooks read on stdin (built before pivot_root: nothing to import after), and
    # what a seccomp agent is told with the notification fd
    status = hook_state(start.id, "creating", init, start.bundle, start.spec.annotations)
    state = msgspec.json.encode(status)
    # the startContainer hooks' (after start, as runc's init tells them: "created")
    started = msgspec.json.encode(hook_state(start.id, "created", init, start.bundle, start.spec.annotations))
    _creating_hooks(sock, start, hooks, init, state, spans)
    _finish(root, spec, spans)
    t_user = time.monotonic_ns()

    def ready() -> None:
        """Once pid 1 is the container's user: Ready, after which we exit (see hand_over).
        Ready makes us visible to the container's other processes (exec's): no fd or
        privilege of ours may lead to the host from here on."""
        spans.add("user", t_user)
        sc.leave_host_proc()
        remote_init.shed_privileges({sock.fileno()})  # (chan: handed over and closed)
        spans.add("exec", time.monotonic_ns())
        protocol.send(sock, protocol.Ready(spans.items, init))

    fifo, console, bpf, listener = taken
    remote_init.hand_over(chan, init, spec, bpf, fifo, console, (listener, status) if listener else None, started,
                          in_userns, ready)
    os._exit(0)


def _from_the_host(start: protocol.Start, hooks, spans: Spans) -> tuple:
    """What the init needs later from the host's tree, taken before any namespace is joined
    (a mount namespace named by path would resolve them in another tree) or pivot_root:
    exec.fifo, the console socket, the seccomp filter (libseccomp is a host library) and its
    agent's connection: (fifo, console, bpf, listener)."""
    spec = start.spec
    if hooks is not None and hooks.create_container:
        import subprocess  # noqa: F401 - imported from the host's tree, before any namespace is joined
    fifo = os.open(start.exec_fifo, os.O_RDWR | os.O_CLOEXEC)
    console = process.connect_console(start.console_socket) if start.console_socket else None
    bpf = listener = None
    if spec.linux.seccomp is not None:
        with spans.span("seccomp compile", rules=len(spec.linux.seccomp.syscalls)):
            bpf = seccomp.export(spec.linux.seccomp)
            listener = seccomp.connect_listener(spec.linux.seccomp)
    return fifo, console, bpf, listener


def _build(sock: socket.socket, start: protocol.Start, sources, cgroups, in_userns: bool, spans: Spans):
    """The container's root, in its mount namespace: the rootfs, the spec's mounts, the
    devices, the GPU mounts the supervisor streams."""
    spec = start.spec
    assert spec.process is not None
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
    return root


def _creating_hooks(sock: socket.socket, start: protocol.Start, hooks, init: int, state: bytes, spans: Spans) -> None:
    """The hooks of a container being created, after the mounts and before pivot_root:
    prestart and createRuntime, which the supervisor runs in the runtime's namespaces while
    we wait, then createContainer, here in the container's."""
    if start.hooks_pause:
        with spans.span("runtime hooks"):
            protocol.send(sock, protocol.Paused(init))
            if not isinstance(protocol.recv_request(sock), protocol.Resume):
                raise GoferError("supervisor gave up during the createRuntime hooks")
    if hooks is not None and hooks.create_container:
        with spans.span("createContainer hooks"):
            run_hooks(hooks.create_container, "createContainer", state)


def _finish(root, spec, spans: Spans) -> None:
    """pivot_root, then what the container may not undo: sysctls, masked and read-only
    paths, a read-only root, the hostname, the root's propagation."""
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
        try:
            protocol.send(sock, frame)
        except OSError:
            pass  # the supervisor gave up first and says why itself
    os._exit(code)
