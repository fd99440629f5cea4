"""The warm server (`sandbox serve`, or `sandbox hook serve`): a resident process that has
imported everything once and forks a child per request, for OCI hooks and for the verbs
that start no process (SERVED); and the planner of exec, create and run.

A hook is a new Python process per container: its interpreter and imports (msgspec, the
plan, the ELF reader) are ~20 ms of the ~25 it adds to `runc run`, its work ~5. The hook
entries `hook install` and `cdi generate` write run the `sandbox` launcher (C), which sends
the hook's call to the server as a verb (below), the container state on the stdin it
passes; where no server is of use, it runs our Python, which does the work itself.

Only root with CAP_SYS_ADMIN in our namespaces and root may be served (SO_PEERCRED and
/proc: _trusted_peer); the socket lives in a directory only root can enter, reached from /
through directories only root can change (mounts/trusted.py: the server refuses to start
otherwise, and the filter cache beside the socket is checked so at each use). The accept
loop never waits on a peer: one it declines is answered at once, a trusted one waits in
its poll set until its request comes.

A served verb (state, kill, delete, start, ..., a hook's `hook` and `cdi hook`) comes from
the `sandbox` launcher itself (sandbox/launcher.c), never from Python:

    launcher (the verb's process)          server                   child
    {"verb": argv, "cwd", "umask", "env"}
      + SCM_RIGHTS stdin, stdout, stderr -> accept, trusted peer? -> fork: those fds as
                                                                     0, 1, 2, that cwd, umask
                    <------------------------------------------      {"running"}
                                                                     and environment; cli.main
                    <------------------------------------------      {"code"}
    exit with it (on {"fallback"}, or an EOF before {"running"}, or nothing in TAKE_UP_S: a
    server that never took the verb up, start Python and run the verb itself; an EOF after
    {"running"}: one line, exit 1, never a second run)

These verbs fork nothing the container runs (poststart and poststop hooks are the spec's
commands, run to completion), so nothing needs to descend from the engine's process. exec
does fork the container's process: its child answers with a plan, not {"running"}, and the
launcher forks (sandbox/exec_frontend.py, sandbox/frontend.c); so does create's, whose
gofer has the launcher fork the init and builds its root (sandbox/create_frontend.py,
gofer/remote_init.py): its child says {"running"} once it will not decline, before it
claims the id, and the "clone" records follow. run goes as create does, then the server's
child starts the container, and for a foreground run answers {"started"}: the launcher,
pid 1's parent, waits for it and sends its wait status back, and the child removes the
container as Python's run does and answers with the exit code. A server keeps the code it
started with: after an upgrade it declines and leaves (the next verb starts the new one).

Which of the launcher's waits have a deadline (sandbox/server_wire.h): the first answer
(TAKE_UP_S: its child sends it at once; past it, shutdown(SHUT_RD) settles a late one, see
launcher.c's first_answer) and the answer to exec's report (the pid file); not what follows
a verb taken up (hooks, systemd, a container's whole life in a foreground run), where the
server's death is the EOF the launcher reports.
"""

from __future__ import annotations

import os
import sys

from sandbox.wire import MAX_REQUEST, SERVED, SOCKET


def unpack_cred(data: bytes) -> tuple[int, int, int]:
    """SO_PEERCRED's struct ucred: (pid, uid, gid)."""
    return (int.from_bytes(data[0:4], sys.byteorder, signed=True), int.from_bytes(data[4:8], sys.byteorder),
            int.from_bytes(data[8:12], sys.byteorder))


def _trusted_peer(conn) -> bool:
    """The client must be what a runtime's hook is: root with CAP_SYS_ADMIN, in our user,
    mount, pid and cgroup namespaces, with our root (a uid-0 process without capabilities, or
    a container's root, may not have us widen a container's device rules, mount into it or
    signal it; a chrooted client's paths are not ours, nor would pivot_root take its child's
    root along)."""
    import socket

    pid, uid, _gid = unpack_cred(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != 0 or pid <= 0:
        return False
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, 77)  # SO_PEERPIDFD (6.5): the very process, not a reused pid
    except OSError:
        pidfd = None
    try:
        with open(f"/proc/{pid}/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
        same = all(os.stat(f"/proc/{pid}/ns/{ns}").st_ino == os.stat(f"/proc/self/ns/{ns}").st_ino
                   for ns in ("user", "mnt", "pid", "cgroup"))  # pid: the state's pid names the same process
        root, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
        same = same and (root.st_dev, root.st_ino) == (ours.st_dev, ours.st_ino)
        if pidfd is not None:
            with open(f"/proc/self/fdinfo/{pidfd}") as f:
                same = same and any(line.split() == ["Pid:", str(pid)] for line in f)
    except (OSError, StopIteration, ValueError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return bool(caps & (1 << 21)) and same  # CAP_SYS_ADMIN


MAX_CHILDREN = 64  # hooks and verbs served at once; more are told to do the work themselves
MAX_WAITING = 256  # connections whose request has not come yet; more are told so too
REQUEST_TIMEOUT = 2.0  # s for a client to send its request (ours send it right after connect)
LINGER = 0.2  # s a leaving server still accepts, its socket gone: a client that found it just before is served


def serve(args, main) -> int:
    """`sandbox serve [--server PATH]` (or `sandbox hook serve`): listen until SIGTERM or SIGINT.
    ``main`` is the CLI's (sandbox/cli.py): a served verb's child runs it.

    The loop never waits on a peer (issue #29: a peer we declined cost it 0.1 s, and 60 that
    never sent stalled every verb for seconds): an untrusted peer is answered without a
    wait, whatever it has sent; a trusted one waits in a poll set until its request comes
    (then a child is forked for it) or REQUEST_TIMEOUT passes (then it is closed)."""
    import select
    import signal
    import time

    from gofer import seccomp
    from mounts.errors import SandboxError

    plain = args.verb == "serve"  # (`hook serve` has none of serve's own flags)
    if plain and args.once:
        return serve_once(main)
    idle = args.idle_exit if plain else 0
    listener = _activated()
    # a client's start (sandbox/server_connect.h): its request waits in our queue, so the
    # first child imports what it needs itself, and we preload (for the next) once it is forked
    lazy = listener is not None and bool(idle)
    if not lazy:
        _preload()
    if listener is not None:
        path = listener.getsockname()
        if idle:  # a client's start: the socket is ours to remove
            _bound[path] = os.lstat(path).st_ino
    else:
        path = os.path.abspath(args.server or (os.environ.get("SANDBOX_SERVER") if plain else None)
                               or SOCKET)
        listener = _listen(path)
    _filter_cache(path)
    from mounts import inventories
    from sandbox.launcher import entry_code

    global _PROGRAM
    _cap_log()
    code = _code_files()
    _PROGRAM, stamp = entry_code(), _code_stamp(code)

    # the inventories our children discover come back here, for the children forked after
    reports, inventories.REPORT = inventories.report_pair()
    print(f"sandbox serve: listening on {path}", file=sys.stderr, flush=True)

    def stop(_signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    listener.setblocking(False)
    poll = select.poll()
    poll.register(listener, select.POLLIN)
    # Each signal also wakes the poll through this pipe: CPython runs a handler once the poll
    # says EINTR, and one that comes while another's handler runs (SIGTERM during SIGCHLD's)
    # would wait, unseen, in a poll re-entered from C (the server ignored such a SIGTERM)
    wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake[1], warn_on_full_buffer=False)
    poll.register(wake[0], select.POLLIN)
    waiting: dict[int, tuple] = {}  # fd -> (connection, deadline), in the order they came
    busy = time.monotonic()  # (idle: the last time a request or child was there)
    leaving: float | None = None  # when our socket went
    try:
        while True:
            timeout = None
            if waiting:
                first = next(iter(waiting.values()))[1]
                timeout = max(0, int((first - time.monotonic()) * 1000) + 1)
            elif leaving is not None:
                timeout = max(0, int((leaving + LINGER - time.monotonic()) * 1000) + 1)
            elif idle and not _children:
                timeout = max(0, int((busy + idle - time.monotonic()) * 1000) + 1)
            events = poll.poll(timeout)
            if _children or waiting:
                busy = time.monotonic()
            now = time.monotonic()
            if not (events or waiting or _children) and (
                    (leaving is not None and now >= leaving + LINGER) or (idle and leaving is None and now >= busy + idle)):
                if leaving is not None:
                    break  # (what came before the socket went, and while it lingered, is served)
                # idle: the socket goes first, then those already queued on it are served
                print(f"sandbox serve: idle {idle} s: leaving", file=sys.stderr, flush=True)
                _unbind(path)
                leaving = now
                continue
            for fd, _events in events:
                if fd == listener.fileno():
                    for conn in _accept_all(listener):
                        if not _trusted_peer(conn):
                            _decline(conn, "a hook server serves only root with CAP_SYS_ADMIN in its namespaces and root")
                        elif _code_stamp(code) != stamp:
                            _decline(conn, "the server's code changed since it started (an upgrade): it leaves")
                            _unbind(path)
                            leaving = leaving or time.monotonic()
                        elif len(waiting) >= MAX_WAITING:
                            _decline(conn, f"{MAX_WAITING} connections wait for their request")
                        else:
                            waiting[conn.fileno()] = (conn, time.monotonic() + REQUEST_TIMEOUT)
                            poll.register(conn, select.POLLIN)
                            continue
                        conn.close()
                elif fd in waiting:
                    conn = waiting.pop(fd)[0]
                    poll.unregister(fd)
                    with conn:
                        if _has_request(conn):
                            inventories.receive(reports)  # (what children sent since: never waited for)
                            _cap_log()
                            _fork_child(conn, [listener, reports, *(c for c, _ in waiting.values())], wake, main)
                            if lazy:  # (and their files, as they are now; the rest as they were at our start)
                                _preload()
                                extra = [f for f in _code_files() if f not in code]
                                code, stamp, lazy = code + extra, stamp + _code_stamp(extra), False
                elif fd == wake[0]:  # (emptied: the handlers themselves run between bytecodes)
                    try:
                        while os.read(wake[0], 256):
                            pass
                    except BlockingIOError:
                        pass
            now = time.monotonic()
            while waiting and next(iter(waiting.values()))[1] <= now:  # (deadlines in order: one timeout)
                fd, (conn, _) = next(iter(waiting.items()))
                del waiting[fd]
                poll.unregister(fd)
                conn.close()
        return 0
    except SandboxError as e:
        print(f"sandbox serve: {e}", file=sys.stderr)
        return 1
    finally:
        _unbind(path)  # (before the listener closes: no client may find a socket nobody answers)
        listener.close()
        if idle and seccomp.CACHE:
            import shutil

            shutil.rmtree(seccomp.CACHE, ignore_errors=True)  # (a client's start: nothing of it stays)
            try:
                os.rmdir(os.path.dirname(seccomp.CACHE))  # (another server's may be there still)
            except OSError:
                pass


def _unbind(path: str) -> None:
    """Remove our socket (ours still, not a newer server's): no new client reaches us."""
    try:
        if _bound.pop(path, None) == os.lstat(path).st_ino:
            os.unlink(path)
    except OSError:
        pass


LOG_CAP = 1 << 20  # bytes of a log file of ours kept: past it, emptied


def _cap_log() -> None:
    """Our log, where it is a file we append to (a client's start: SOCKET.log on /run, in
    memory), emptied once past LOG_CAP: a line a request must not fill a node's memory."""
    import fcntl
    import stat

    try:
        st = os.fstat(2)
        if stat.S_ISREG(st.st_mode) and st.st_size > LOG_CAP and fcntl.fcntl(2, fcntl.F_GETFL) & os.O_APPEND:
            os.ftruncate(2, 0)
    except OSError:
        pass


def _code_files() -> list[str]:
    """Our packages' directories and every module of theirs loaded so far (the server's,
    preloaded: the ones its children run)."""
    import gofer
    import mounts
    import sandbox

    tops = tuple(os.path.dirname(p.__file__ or "") for p in (sandbox, gofer, mounts))
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return [*tops, *sorted(f for f in files if isinstance(f, str) and f.startswith(tops))]


def _code_stamp(files: list[str]) -> list[tuple[int, int, int]]:
    """``files`` as they are now (inode, mtime, size): an upgrade replaces or rewrites them,
    and a server that kept the code it started with would serve the new installation's
    clients with the old code. (~70 stats: tens of microseconds a connection.)"""
    stamp = []
    for path in files:
        try:
            st = os.stat(path)
            stamp.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append((0, 0, 0))
    return stamp


def _accept_all(listener) -> list:
    """Every connection in the listen queue now (none may wait for the next poll)."""
    conns: list = []
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return conns
        except OSError:  # (ECONNABORTED, EMFILE ...: those accepted so far; the rest at the next poll)
            return conns
        conn.setblocking(True)
        conns.append(conn)


def _has_request(conn) -> bool:
    """Whether a request waits on ``conn`` (not the EOF of a peer that left without one)."""
    import socket

    try:
        return len(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)) > 0
    except OSError:
        return False


def _fork_child(conn, others: list, wake: tuple[int, int], main) -> None:
    """A child for the request waiting on ``conn`` (trusted), or a decline where MAX_CHILDREN
    are at work: never a wait here, slow clients holding every child must not stop the
    others (the hook does its own work, serialized per container). ``others``: the listener
    and the connections still waiting, closed in the child with the signal pipe ``wake``
    (a copy held there would keep the EOF of its server child's death from its client)."""
    import signal

    if len(_children) >= MAX_CHILDREN:
        _decline(conn, f"{MAX_CHILDREN} hooks are being served")
        return
    conn.settimeout(REQUEST_TIMEOUT)
    # SIGCHLD held until the child is counted: reaped before it was added, its pid would
    # stay in _children for good, and MAX_CHILDREN of those stop the server
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        for other in others:
            other.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        code = 1
        try:
            code = _handle(conn, main)
        except BaseException as e:  # never back into the accept loop
            print(f"sandbox serve: {e}", file=sys.stderr)
        finally:
            os._exit(code)
    _children.add(child)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def serve_once(main) -> int:
    """The launcher's own planner (sandbox/launcher.c, where no server listens): the one
    request on fd 3, its end of a socketpair, served as a server's child serves it, in a
    session of our own (a ^C to the caller's process group is the container's to get)."""
    import socket

    from sandbox.launcher import entry_code

    global _PROGRAM
    _PROGRAM = entry_code()
    os.setsid()
    conn = socket.socket(fileno=3)
    conn.set_inheritable(False)
    if not _trusted_peer(conn):
        _decline(conn, "a planner serves only root with CAP_SYS_ADMIN")
        return 0
    return _handle(conn, main)


def _activated():
    """The listening socket systemd passed us (a socket unit: LISTEN_FDS=1, fd 3), or None."""
    import socket

    if os.environ.pop("LISTEN_PID", None) != str(os.getpid()) or os.environ.pop("LISTEN_FDS", None) != "1":
        return None
    os.environ.pop("LISTEN_FDNAMES", None)
    listener = socket.socket(fileno=3)
    listener.set_inheritable(False)
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_SEQPACKET:
        from mounts.errors import SandboxError

        raise SandboxError("the socket systemd passed is not a unix SOCK_SEQPACKET one (ListenSequentialPacket=)")
    return listener


def _listen(path: str):
    import socket

    from mounts.errors import SandboxError

    os.close(_root_only_dir(os.path.dirname(path), f"--server {path}", "another user could take the socket's place"))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        probe.connect(path)
    except OSError:
        try:
            os.unlink(path)  # a killed server's socket: nobody answers it
        except FileNotFoundError:
            pass
    else:
        probe.close()
        raise SandboxError(f"--server {path}: another hook server answers there")
    finally:
        probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    umask = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(umask)
    listener.listen(64)
    _bound[path] = os.lstat(path).st_ino
    return listener


def _root_only_dir(directory: str, what: str, why: str) -> int:
    """``directory`` (an fd to close), made 0700 where missing: it and every directory and
    link on the way from / root's and writable by no one else (mounts/trusted.py; what is
    missing is made only below a directory that passes)."""
    from mounts.trusted import open_root_only

    directory = os.path.abspath(directory)
    there = directory
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    if there != directory:
        os.close(open_root_only(there, what, why, leaf=False))
        for name in directory[len(there):].strip("/").split("/"):
            there = os.path.join(there, name)
            try:
                os.mkdir(there, 0o700)
            except FileExistsError:
                pass  # (made meanwhile: checked below like the rest)
    return open_root_only(directory, what, why)


def _filter_cache(path: str) -> None:
    """Exported seccomp filters kept beside the socket (gofer/seccomp.py's CACHE), for the
    creates and execs our children serve; without it each compiles its filter. Each server
    has a directory of its own there, and removes the others' as it starts: what another
    server compiled (older code, an older libseccomp) is not ours, even from a child of
    its still at work. Its way from / is checked here and at each use (gofer/seccomp.py)."""
    import shutil
    import stat

    from gofer import seccomp
    from mounts.errors import SandboxError

    top = f"{path}.bpf"  # (this socket's own: a --server in a shared directory empties nobody else's)
    why = "a filter planted there would be a container's"
    try:
        fd = _root_only_dir(top, "seccomp filter cache", why)  # (the socket's directory too: a socket unit's)
        try:
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            os.mkdir(str(os.getpid()), 0o700, dir_fd=fd)
        finally:
            os.close(fd)
    except (OSError, SandboxError) as e:
        print(f"sandbox serve: no seccomp filter cache: {e}", file=sys.stderr, flush=True)
        return
    seccomp.CACHE = os.path.join(top, str(os.getpid()))


_bound: dict[str, int] = {}  # socket path -> the inode we bound there
_PROGRAM = ""  # the `sandbox` program our clients run (launcher.entry_code): another's is declined
_children: set[int] = set()


def _receive(conn):
    """One request and the fds sent with it (closed-on-exec, as every fd of ours)."""
    import socket

    from gofer.frontend_plan import MAX_FILE, MEMFD

    size = socket.CMSG_SPACE(4 * 4)
    data, ancillary, _flags, _addr = conn.recvmsg(MAX_REQUEST, size, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], "little") for i in range(0, len(payload) - len(payload) % 4, 4)]
    if data == MEMFD.encode() + b"\0" and fds:  # a request bigger than one message (the launcher's): in a sealed memfd
        import fcntl

        memfd, fds = fds[0], fds[1:]
        whole = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE  # (a file that cannot change or block)
        try:
            size = os.fstat(memfd).st_size
            data = os.pread(memfd, size, 0) if size <= MAX_FILE and fcntl.fcntl(memfd, fcntl.F_GET_SEALS) & whole == whole \
                else b""
        except OSError:
            data = b""
        finally:
            os.close(memfd)
    return data, fds


def _handle(conn, main) -> int:
    """In the forked child: one request, answered on ``conn``."""
    from sandbox.jsonlite import loads

    data, fds = _receive(conn)
    try:
        request = loads(data.decode())
    except (ValueError, UnicodeError):
        request = None
    if isinstance(request, dict) and request.get("program", _PROGRAM) != _PROGRAM:
        for fd in fds:
            os.close(fd)
        _decline(conn, "a client of another installation of sandbox", read=False)
        return 0
    if isinstance(request, dict) and "verb" in request:
        return _run_verb(conn, request, fds, main)
    for fd in fds:
        os.close(fd)
    _decline(conn, "a request the launcher does not send", read=False)
    return 0


def _run_verb(conn, request: dict, fds: list[int], main) -> int:
    """A verb of SERVED, as the launcher would have run it: its stdio, cwd, umask, environment."""
    import signal
    import time

    from sandbox import flags
    from sandbox.jsonlite import dumps

    t = time.monotonic()
    argv, cwd, umask, env = request.get("verb") or [], request.get("cwd"), request.get("umask"), request.get("env")
    at = flags.verb_index(argv) if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None
    verb = argv[at] if at is not None else None
    hook = at is not None and _hook_call(argv[at:])
    if hook and "--trace" in argv:
        _decline(conn, "a hook's trace is the hook's own to write", read=False)
        return 0
    if not ((verb in SERVED or verb in ("exec", "create", "run") or hook) and isinstance(cwd, str) and isinstance(umask, int)
            and 0 <= umask <= 0o777 and isinstance(env, list) and all(isinstance(e, str) and "=" in e for e in env)
            and len(fds) == 3):
        _decline(conn, "a request the launcher does not send", read=False)
        return 0
    try:
        os.chdir(cwd)
    except OSError as e:
        _decline(conn, f"cwd {cwd}: {e.strerror}", read=False)
        return 0
    log = os.dup(2)  # the server's own stderr, before the caller's takes its place
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.umask(umask)
    os.environ.clear()
    os.environ.update(e.split("=", 1) for e in env)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    frontend: object = None
    if verb == "exec":
        # exec answers with a plan (or an error's code) for the launcher to carry out
        from sandbox.exec_frontend import Decline, Frontend

        frontend = Frontend(conn)
    elif verb in ("create", "run"):
        # create's gofer has the launcher fork the init (or the verb ends with an error's code);
        # a foreground run's child then waits for the launcher to report the container's end
        import socket

        if not _sealed():  # (its builder enters the container's pid namespace: never a writable host file)
            os.dup2(log, 2)
            _decline(conn, f"{verb}: the server's interpreter is not sealed (start it as `sandbox serve`)", read=False)
            return 0

        from sandbox.create_frontend import CreateFrontend
        from sandbox.exec_frontend import Decline

        pid = unpack_cred(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        frontend = CreateFrontend(conn, pid)
    else:
        try:
            conn.sendall(b'{"running": true}')  # from here on the verb is ours: died, the launcher may not redo it
        except OSError as e:  # (a launcher that stopped waiting: it runs the verb itself)
            os.write(log, f"sandbox serve: {verb}: the launcher stopped waiting: {e.strerror}\n".encode())
            return 0
    try:
        code = main(argv, frontend)
    except SystemExit as e:  # argparse: an error (2) or --help (0)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:
        if frontend is None or not isinstance(e, Decline) or getattr(frontend, "planned", False):
            raise
        os.dup2(log, 2)  # (the decline's line goes to our log, not the caller's stderr)
        _decline(conn, f"{verb}: {e}", read=False)
        return 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        conn.sendall(dumps({"code": code}).encode())
    except OSError:
        pass  # (a run's launcher killed while it waited: its container went with it)
    line = f"sandbox serve: {verb}: {' '.join(argv)[:300]}: exit {code} in {(time.monotonic() - t) * 1e3:.1f} ms\n"
    os.write(log, line.encode("utf-8", "replace"))
    return 0


def _hook_call(argv: list[str]) -> bool:
    """Whether ``argv`` (from the verb on) is an OCI hook's call, served as a verb: `hook` as
    `hook install` writes it, or our CDI spec's `cdi hook` (launcher.c's hook_call)."""
    if argv[:2] == ["cdi", "hook"]:
        return True
    return argv[:1] == ["hook"] and "install" not in argv and "serve" not in argv


def _sealed() -> bool:
    """Whether our interpreter is a file no one can write (CVE-2019-5736): on a read-only
    mount, or a memfd sealed against writes (sandbox/launcher.c runs a server so)."""
    import fcntl

    if os.statvfs("/proc/self/exe").f_flag & os.ST_RDONLY:
        return True
    try:
        fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE)
    except OSError:
        return False
    finally:
        os.close(fd)


def _decline(conn, why: str, read: bool = True) -> None:
    """Tell the client to do the work itself (it then runs as if no server listened). Never
    waits: the accept loop calls it."""
    import socket

    from sandbox.jsonlite import dumps

    try:
        os.write(2, f"sandbox serve: declined: {why}\n".encode(errors="backslashreplace"))
    except OSError:
        pass
    if read:
        try:
            # the request, if it has come (ours send it right after connect): closed with it
            # unread, the connection resets before the client reads our answer (its fds, if
            # any, are closed with the message); a client that reads the reset declines alike
            conn.recv(MAX_REQUEST, socket.MSG_DONTWAIT)
        except OSError:
            pass
    try:
        conn.send(dumps({"fallback": why}).encode(), socket.MSG_DONTWAIT)  # (never held up by one that does not read)
    except OSError:
        pass


def _preload() -> None:
    """Everything a hook and a served verb import, once, here: each child starts with it
    loaded (libseccomp too, which exec's plan compiles the container's filter with)."""
    from gofer import syscalls

    try:
        syscalls.Seccomp.lib()
    except OSError:
        pass  # (no libseccomp: a container's filter is then refused, as without the server)
    import argparse  # noqa: F401
    import hashlib  # noqa: F401 - the seccomp filter cache's key
    import subprocess  # noqa: F401 - the bundle's hooks (Docker's libnetwork hook: every create of Docker's)
    import tomllib  # noqa: F401 - the config file, read by every verb where there is one

    import sandbox.config  # noqa: F401
    import sandbox.hook_cmd  # noqa: F401
    import sandbox.trace  # noqa: F401
    from gofer import embed, enter, gpu, main, remote_init, root, seccomp, spans, systemd  # noqa: F401
    from mounts import atomic, bundle, driver, elf, ldcache, plan, request, spec  # noqa: F401
    from sandbox import (  # noqa: F401
        api,
        cdi_cmd,
        create_cmd,
        create_frontend,
        delete_cmd,
        exec_cmd,
        exec_frontend,
        features_cmd,
        launch,
        run_cmd,
        start_cmd,
        state_cmd,
        update_cmd,
    )


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _children.discard(pid)
