"""Start a container up to the moment its init is ready: what `sandbox run` and `sandbox
create` share, in the planner (the server's child), once sandbox/fork.py has forked the
gofer; the launcher makes pid 1 (sandbox/executor/create_plan.py, gofer/remote_init.py)."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from mounts.proc import exit_code
from sandbox.fork import Gofer

if TYPE_CHECKING:  # imported where used, for start-up time
    from gofer.spans import Span
    from mounts.spec import Hooks
    from sandbox.state import State

TRACE_ANNOTATION = "org.gpu-sandbox.trace"  # a bundle may ask for a startup trace itself


class Options(NamedTuple):
    """What a launch needs from the command line and the config file."""

    cid: str
    bundle: str
    root: str  # the state directory
    driver_root: str = "/"
    dev_root: str | None = None
    gpus: str | None = None
    capabilities: str | None = None  # --capabilities: overrides the bundle's
    max_capabilities: str | None = None  # the config file's ceiling
    scratch_size: str | None = None
    console_socket: str | None = None
    preserve_fds: int = 0
    foreground: bool = False  # `sandbox run`: the state goes when the run ends
    trace: str | None = None  # --trace FILE
    systemd_cgroup: bool = False  # --systemd-cgroup: cgroupsPath is slice:prefix:name
    cdi_spec_dirs: tuple[str, ...] = ()  # --cdi-spec-dir, after /etc/cdi and /var/run/cdi
    debug: bool = False  # --debug: discovery's notes on stderr


def options(args, foreground: bool) -> Options:
    """Launch options from parsed arguments: runc's ``ID [-b BUNDLE]`` or our ``BUNDLE``."""
    bundle = os.path.abspath(args.bundle or ".")
    cid = args.container_id or os.path.basename(bundle)
    for what, path in (("--bundle", bundle), ("--root", args.root), ("--driver-root", args.driver_root),
                       ("--console-socket", args.console_socket), ("--pid-file", args.pid_file)):
        if path is not None and _not_utf8(path):
            from mounts.errors import SandboxError

            raise SandboxError(f"{what} {path.encode(errors='surrogateescape')!r}: not UTF-8 (the container's "
                               "state and spec record paths as JSON strings)", code=2)
    return Options(cid, bundle, args.root, args.driver_root, args.dev_root, args.gpus, args.capabilities,
                   args.max_capabilities, args.scratch_size, args.console_socket, args.preserve_fds, foreground,
                   args.trace, args.systemd_cgroup, tuple(args.cdi_spec_dir), args.debug)


def _not_utf8(path: str) -> bool:
    """Whether ``path`` (as the command line gives it: surrogateescape'd) has bytes that are not UTF-8."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return True
    return False


class Launched(NamedTuple):
    pid: int  # the init, as the host sees it
    spans: list[Span]  # the gofer's
    state: State  # as written
    hooks: Hooks | None  # the bundle's Hooks we run
    trace: str | None  # where to write the startup trace: --trace, else the bundle's annotation


NO_DEVICE_RULES = ("no devices cgroup here (a v1 devices controller, or cgroup v2) to restrict the container's "
                   "device access: refusing to run it")


class Launcher(NamedTuple):
    """The launcher (sandbox/executor/create_plan.py): it goes into the container's cgroup, and
    the gofer has it fork the init (gofer/remote_init.py)."""

    pid: int
    fd: int  # our connection to it
    cgroups: list[str]  # its cgroups' directories before: where it goes back should the create fail


def read_bundle(opts: Options):
    """(the bundle, mounts.request.resolve's (spec, GPU request, warnings)) of ``opts``."""
    from mounts.bundle import load_bundle
    from mounts.request import resolve

    bundle = load_bundle(opts.bundle)
    return bundle, resolve(bundle.spec, opts.gpus, opts.capabilities, opts.max_capabilities, opts.cdi_spec_dirs)


def launch(opts: Options, gofer: Gofer, spans, launcher: Launcher, read=None) -> Launched:
    """Claim the id, stream the plan, run the runtime-namespace hooks when the gofer pauses,
    and return once the init is ready. On any failure nothing is left: the gofer and the init
    are killed, the state directory removed, and the error (one line) raised. ``read``:
    read_bundle's, where the caller has it already (the front end checked the bundle)."""
    import prctl

    from mounts.errors import SandboxError
    from sandbox.state import StateDir, new_state

    # Orphans below us come to us, not to the host's init: the builder once the gofer that
    # forked it has exited (remote_init.join). We reap it, so the container's cgroup and pid
    # namespace hold nothing of ours. (pid 1 is the launcher's child, never ours.)
    prctl.set_child_subreaper(True)
    sd = StateDir(opts.root, opts.cid)
    # the claim: ours is the pid recorded (and its start time) until the init is ready; the
    # gofer's would read "stopped" once it has forked pid 1, and kill and delete go by it
    sd.create(new_state(opts.cid, os.getpid(), opts.bundle, foreground=opts.foreground), fifo=True)
    made = _Made()
    try:
        error = None
        try:
            with spans.span("bundle parse"):
                bundle, spec, request, cdi_actions = _checked(read or read_bundle(opts), opts)
                made.bundle, made.annotations = bundle.path, spec.annotations
            with spans.span("cgroup"):
                made.cgroup = _cgroup(spec, opts, sd, launcher)
                gofer.warm[0] = False
                _devices_enforced(made.cgroup)
            made.hooks = spec.hooks.ours() if spec.hooks is not None else None
            made.trace = opts.trace or _annotated_trace(spec.annotations.get(TRACE_ANNOTATION), opts)
            _stream(gofer.sock, bundle, spec, request, cdi_actions, opts, sd, launcher, spans, made)
        except BrokenPipeError:
            pass  # the gofer failed first: its Error frame says why
        except (SandboxError, OSError) as e:
            error = e
            gofer.sock.shutdown(socket.SHUT_WR)  # the gofer sees EOF before End and gives up
        ready = _await(gofer, launcher, opts, spans, made, error)
        state = _state(opts, ready.pid, bundle, spec, made.hooks, made.cgroup)
        # the gofer, and its builder, which was in the container's pid namespace (a zombie
        # there would hold pid 1's exit): gone before the container is recorded, as no
        # process can be exec'd into it until then to find the builder
        _reap_all(time.monotonic() + 5)
        move_back(launcher)  # (pid 1 forked: the container's cgroup is its processes' alone from here on)
        if made.cgroup is not None and (limit := _pids_limit(spec.linux.resources)) is not None:
            from mounts.spec import Pids, Resources

            made.cgroup.limits(Resources(pids=Pids(limit=limit)))  # (only the container's processes are left)
        sd.write(state)
        return Launched(ready.pid, ready.spans, state, made.hooks, made.trace)
    except BaseException:
        gofer.sock.close()  # an init we do not know yet reads EOF and gives up
        for pid in {made.init, gofer.pid} - {None}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_all(time.monotonic() + 5)
        if made.cgroup is not None:
            move_back(launcher)  # (out of the cgroup it is to remove; a systemd scope's stop would kill it)
            made.cgroup.remove()
        sd.remove()
        raise
    finally:
        gofer.warm[0] = False
        gofer.sock.close()


class _Made:
    """What a launch has made so far: what a failure removes (the cgroup, the init), and
    what its end records (the hooks left to run, the trace)."""

    init: int | None = None
    cgroup = None
    bundle = ""  # (its path, and the spec's annotations: a runtime hook's state has them)
    annotations: dict[str, str] = {}
    hooks = None
    trace: str | None = None


def _checked(read, opts: Options):
    """read_bundle's (bundle, (spec, request, warnings)), checked for what a create needs:
    (bundle, spec, request, the actions of our CDI spec's hooks, done natively)."""
    from mounts.errors import BundleError

    bundle, (spec, request, warnings) = read
    if spec.process is None:
        raise BundleError(f"{bundle.path}/config.json: process is missing: nothing to run")
    for w in warnings:
        from sandbox.messages import warn

        warn(w)
    cdi_actions = []  # our CDI spec's hooks (an engine's CDI injection): done natively
    if spec.hooks is not None and (cdi_args := spec.hooks.cdi_args()):
        from mounts.cdi import spec_hook_actions

        cdi_actions = spec_hook_actions(cdi_args)
    # (a foreground run's terminal is the launcher's)
    if spec.process.terminal and not opts.foreground and not opts.console_socket:
        raise BundleError(f"{bundle.path}/config.json: process.terminal is set: a detached "
                          "container needs --console-socket to hand its terminal to")
    if opts.console_socket and not (spec.process.terminal and not opts.foreground):
        raise BundleError(f"--console-socket {opts.console_socket}: only for a detached container "
                          f"with a terminal ({bundle.path}/config.json: process.terminal is "
                          f"{str(spec.process.terminal).lower()})")
    return bundle, spec, request, cdi_actions


def _devices_enforced(cgroup) -> None:
    """Fail closed: without device rules a node in the image (or one made with CAP_MKNOD)
    opens the host's device itself, a disk, /dev/kmsg."""
    from gofer.cgroups import devices_enforced
    from mounts.errors import SandboxError

    if not devices_enforced(cgroup.dirs.values() if cgroup else ()):
        raise SandboxError(NO_DEVICE_RULES)


def _stream(sock, bundle, spec, request, cdi_actions, opts: Options, sd, launcher: Launcher, spans, made: _Made) -> None:
    """The gofer's frames: Start, the GPU plan, our CDI hook's actions, then End once the
    device rules are sealed (the container's process runs only after it)."""
    from gofer import protocol

    pause = made.hooks is not None and bool(made.hooks.prestart or made.hooks.create_runtime)
    spans.enabled = bool(made.trace)
    protocol.send(sock, protocol.Start(
        spec, bundle.rootfs, bundle.path, spans.enabled, overlay_root=request is not None or bool(cdi_actions),
        scratch_size=opts.scratch_size, id=opts.cid, exec_fifo=sd.fifo, console_socket=opts.console_socket,
        preserve_fds=opts.preserve_fds, hooks_pause=pause, launcher_fd=launcher.fd))
    if request is not None:
        _stream_plan(sock, request, bundle, opts, spans, made.cgroup)
    for action in cdi_actions:  # our CDI hook's links and ld.so.cache, in our own root
        protocol.send(sock, action)
    if made.cgroup is not None:
        with spans.span("device rules"):
            made.cgroup.seal()
    protocol.send(sock, protocol.End())


def _await(gofer: Gofer, launcher: Launcher, opts: Options, spans, made: _Made, error):
    """Every frame of the gofer's until EOF, the runtime-namespace hooks run when it pauses:
    its Ready, or the error (``error``: ours, from before). The socket is close-on-exec, so
    EOF means the container exec'd (run), its init waits for start (create: it closes its
    end after Ready), or the gofer is gone. An Error after Ready is an exec that failed."""
    from gofer import protocol
    from mounts.errors import SandboxError

    t = time.monotonic_ns()
    ready = failure = None
    broken: list = []
    while (msg := _recv(gofer.sock, broken)) is not None:
        if isinstance(msg, (protocol.Paused, protocol.Ready)) and (ready is not None or made.init not in (None, msg.pid)):
            # one init, one Ready: a frame naming another process is no gofer's
            failure = failure or SandboxError("the gofer's frames name a second init")
        elif isinstance(msg, protocol.Paused):
            made.init = msg.pid
            failure = failure or _runtime_hooks(made.hooks, opts, made.bundle, made.annotations, msg.pid, gofer.sock)
        elif isinstance(msg, protocol.Ready):
            ready, made.init = msg, msg.pid
            if failure is None and _hung_up(launcher.fd):
                failure = SandboxError("the launcher exited before the container was recorded")
        else:
            failure = failure or msg.error()
    spans.add("wait for the init", t)
    failure = error or failure
    if failure is None and ready is None:
        failure = _gofer_died(gofer.pid)
        if broken and "exited with status 0" in str(failure):  # (no signal, no init's end to say)
            failure = broken[0]
    if failure is not None:
        raise failure
    assert ready is not None  # (failure is set whenever ready is not)
    return ready


def _hung_up(fd: int) -> bool:
    """Whether the peer of our connection ``fd`` is gone (it sends nothing while it waits)."""
    import select

    p = select.poll()
    p.register(fd, select.POLLRDHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))


def move_back(launcher: Launcher) -> None:
    """The launcher back into the cgroups it came from (best effort: it may be gone, and
    then its pid may be another process's: nothing is written)."""
    if _hung_up(launcher.fd):
        return
    for d in launcher.cgroups:
        try:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(launcher.pid))
        except OSError:
            pass


def _reap_all(deadline: float) -> None:
    """Reap the gofer and every orphan that came to us (we are a subreaper), until none is
    left or the deadline passes: a zombie would keep the container's cgroup busy."""
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.002)


def _annotated_trace(value: str | None, opts: Options) -> str | None:
    """The trace a bundle asks for with its annotation: "true" or a bare file name, written
    under ``<--root>/traces/``. Never a path: annotations come from whoever writes the pod
    spec, and a path would let them overwrite any file of the host's."""
    from mounts.errors import BundleError

    if not value:
        return None
    name = f"{opts.cid}.json" if value.lower() in ("1", "true", "yes") else value
    from sandbox.state import valid_id

    if not valid_id(name):  # letters, digits, _.+-, at most 200, no leading dot: never a path
        raise BundleError(f"annotations.{TRACE_ANNOTATION}: {value!r} must be true or a file name, not a path")
    directory = os.path.join(opts.root, "traces")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, name)


def _state(opts: Options, pid: int, bundle, spec, hooks, cgroup):
    from sandbox.state import new_state

    return new_state(opts.cid, pid, bundle.path, bundle.rootfs, spec.annotations, creating=False,
                     foreground=opts.foreground, hooks=hooks, cgroup=cgroup, pid_ns_own=_own_pid_ns(spec))


def _own_pid_ns(spec) -> bool:
    """Whether the container gets a pid namespace of its own (not joined, not the host's)."""
    return any(ns.type == "pid" and not ns.path for ns in spec.linux.namespaces)


def _cgroup(spec, opts: Options, sd, launcher: Launcher):
    """The container's cgroup, limits and device rules applied, with the process that forks
    the init (which inherits it) in it: the ``launcher``. None on a host without any cgroup
    hierarchy. A relative cgroupsPath (an id's default too) is below the caller's cgroups:
    the launcher's, never the server's.
    The directories it will make are in the state first (and the systemd unit, once started):
    a create killed at any point is then deleted whole by `delete --force`."""
    from gofer.cgroups import container_cgroup
    from mounts.errors import SandboxError
    from sandbox.state import new_state

    cgroup: Any
    if opts.systemd_cgroup:
        from gofer import systemd

        if not systemd.running():  # (runc's rule and words)
            raise SandboxError("--systemd-cgroup: systemd not running on this host, cannot use the systemd "
                               "cgroups manager")
        cgroup = systemd.SystemdCgroup(spec.linux.cgroups_path, opts.cid)
    else:
        cgroup = container_cgroup(spec.linux.cgroups_path or opts.cid, launcher.pid)
    if cgroup is None:
        if spec.linux.resources is not None:
            raise SandboxError("linux.resources: no cgroup hierarchy is mounted under /sys/fs/cgroup "
                               "to enforce it")
        return None
    state = new_state(opts.cid, os.getpid(), opts.bundle, foreground=opts.foreground, cgroup=cgroup)
    state.cgroup_created = cgroup.missing()
    state.systemd_unit = getattr(cgroup, "unit", "")
    found = cgroup.members()
    if found:
        # Not ours: `kill --all` and `delete --force` signal the container's processes only
        # (those of its own pid namespace), which cannot be told apart from these without one.
        where = next(d for d in cgroup.dirs.values() if d not in state.cgroup_created)
        if not _own_pid_ns(spec):
            raise SandboxError(f"linux.cgroupsPath: {where} already has {len(found)} process(es) and the "
                               "container has no pid namespace of its own: refusing to share the cgroup")
        from sandbox.messages import warn

        warn(f"linux.cgroupsPath: {where} is not empty: {len(found)} process(es) found (they are not the "
             "container's: kill --all and delete --force leave them)")
    sd.write(state)
    try:
        cgroup.create()
        resources = spec.linux.resources
        if _pids_limit(resources) is not None:  # (written once the container is made)
            import msgspec

            resources = msgspec.structs.replace(resources, pids=None)
        cgroup.apply(resources, spec.linux.devices)
        if _hung_up(launcher.fd):  # its pid (SO_PEERCRED) may be another's now
            raise SandboxError("the launcher exited before the container's cgroup was made")
        cgroup.add(launcher.pid)
        if getattr(cgroup, "invocation", ""):  # the unit we started, and what we made beside it
            state.systemd_invocation, state.cgroup_created = cgroup.invocation, list(cgroup.created)
            state.cgroup = list(dict.fromkeys(cgroup.dirs.values()))
            sd.write(state)
    except BaseException:
        cgroup.remove()
        raise
    return cgroup


# A pids limit under this is written once the container is made, not with the others: the
# launcher, pid 1, the gofer, its builder and a createContainer hook's processes share the
# container's cgroup until then (runc's init too is three processes at first). A limit at or
# above it is written at once, as runc does, with no second write (a D-Bus call under systemd).
PIDS_WHILE_MADE = 32


def _pids_limit(resources) -> int | None:
    """The spec's pids limit where it is under PIDS_WHILE_MADE, else None."""
    pids = resources.pids if resources is not None else None
    return pids.limit if pids is not None and 0 < pids.limit < PIDS_WHILE_MADE else None


def _stream_plan(sock, request, bundle, opts: Options, spans, cgroup=None) -> None:
    """Discover the driver and send each action of the plan the moment it is known."""
    from gofer import protocol
    from mounts.actions import Device
    from mounts.inventories import inventory as kept_inventory
    from mounts.layout import layout_of
    from mounts.plan import iter_plan

    with spans.span("discovery") as s:
        inventory, kept = kept_inventory(opts.driver_root, opts.dev_root)
        s.args["kept"] = int(kept)  # (a trace's args are ints or strings)
        layout = layout_of(bundle.rootfs)
    if opts.debug:  # what discovery passed over: wrappers, links leading nowhere ...
        from sandbox.messages import stderr_line

        for note in inventory.notes:
            stderr_line(f"sandbox: debug: {note}")
    t = time.monotonic_ns()
    n = 0
    for action in iter_plan(request, inventory, layout):
        if cgroup is not None and isinstance(action, Device):
            cgroup.allow(action.major, action.minor)  # before the gofer binds it
        protocol.send(sock, action)
        n += 1
    spans.add("closure + stream", t, actions=n)


def _recv(sock, broken: list):
    """The next frame from the gofer; None at EOF, or for a broken frame (kept in
    ``broken``: said when nothing better says why the gofer stopped)."""
    from gofer import protocol

    try:
        return protocol.recv_reply(sock)
    except ConnectionResetError:
        return None
    except protocol.ProtocolError as e:
        broken.append(e)
        return None


def _runtime_hooks(hooks, opts: Options, bundle: str, annotations, pid: int, sock):
    """prestart then createRuntime, in our (the runtime's) namespaces; Resume the gofer, or
    return the failure (the gofer then sees EOF and gives up)."""
    from gofer.hooks import run_hooks, state_json
    from mounts.errors import SandboxError

    state = state_json(opts.cid, "creating", pid, bundle, annotations)
    try:
        run_hooks(hooks.prestart, "prestart", state)
        run_hooks(hooks.create_runtime, "createRuntime", state)
    except SandboxError as e:
        sock.shutdown(socket.SHUT_WR)
        return e
    _resume(sock)
    return None


def _resume(sock) -> None:
    """Resume to the gofer; one killed meanwhile is said by its end (EOF follows), not as a
    broken pipe."""
    from gofer import protocol

    try:
        protocol.send(sock, protocol.Resume())
    except (BrokenPipeError, ConnectionResetError):
        pass


def _gofer_died(pid: int):
    """Why no Ready came: the gofer's end, or, where it exited 0 having forked the builder
    (which then comes to us, a subreaper), the builder's. The builder is in pid 1's pid
    namespace: pid 1's death kills it (SIGKILL), and that is what is said then."""
    from mounts.errors import SandboxError

    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return SandboxError("the gofer exited before the container started")
    code = exit_code(status)
    if code == 0:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the init, orphaned to us, once it is reaped
            try:
                child, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if child:
                code = exit_code(status)
                how = f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"
                who = "the container's init or its builder" if code == 128 + signal.SIGKILL else "the container's builder"
                return SandboxError(f"{who} {how} before it was ready")  # (SIGKILL: the kernel's, at pid 1's end)
            time.sleep(0.005)
    how = f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"
    return SandboxError(f"the gofer {how} before the container started")




def write_pid_file(path: str, pid: int) -> None:
    """The init's pid, written atomically (engines read it as soon as we exit)."""
    from mounts.atomic import write_atomically

    write_atomically(path, str(pid).encode(), "--pid-file")
