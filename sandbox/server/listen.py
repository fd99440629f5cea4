"""The warm server (`sandbox serve`, or `sandbox hook serve`): a resident process that has
imported everything once and has a child per request (forked ahead of it: the spare), for
OCI hooks and for the verbs that start no process (SERVED); and the planner of exec, create
and run.

A hook is a new Python process per container: its interpreter and imports (msgspec, the
plan, the ELF reader) are ~20 ms of the ~25 it adds to `runc run`, its work ~5. The hook
entries `hook install` and `cdi generate` write run the `sandbox` launcher (C), which sends
the hook's call to the server as a verb (below), the container state on the stdin it
passes; where no server is of use, it runs our Python, which does the work itself.

Only root with CAP_SYS_ADMIN in our namespaces and root may be served (SO_PEERCRED and
/proc: trusted_peer); the socket lives in a directory only root can enter, reached from /
through directories only root can change (mounts/trusted.py: the server refuses to start
otherwise, and the filter cache beside the socket is checked so at each use). The accept
loop never waits on a peer: one it declines is answered at once, a trusted one waits in
its poll set until its request comes.

A served verb (state, kill, delete, start, ..., a hook's `hook` and `cdi hook`) comes from
the `sandbox` launcher itself (sandbox/executor/launcher.c), never from Python:

    launcher (the verb's process)          server                   child
    {"verb": argv, "cwd", "umask", "env",
     "program": its -c code}                                      (another's: declined)
      + SCM_RIGHTS stdin, stdout, stderr -> accept, trusted peer? -> the spare, handed the
                                            (code unchanged?)        connection: those fds as
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
launcher forks (sandbox/executor/exec_plan.py, sandbox/executor/frontend.c); so does create's, whose
gofer has the launcher fork the init and builds its root (sandbox/executor/create_plan.py,
gofer/remote_init.py): its child says {"running"} once it will not decline, before it
claims the id, and the "clone" records follow. run goes as create does, then the server's
child starts the container, and for a foreground run answers {"started"}: the launcher,
pid 1's parent, waits for it and sends its wait status back, and the child removes the
container as Python's run does and answers with the exit code. A server keeps the code it
started with: after an upgrade it declines and leaves (the next verb starts the new one).

Which of the launcher's waits have a deadline (sandbox/executor/server_wire.h): the first answer
(TAKE_UP_S: its child sends it at once; past it, shutdown(SHUT_RD) settles a late one, see
launcher.c's first_answer) and the answer to exec's report (the pid file); not what follows
a verb taken up (hooks, systemd, a container's whole life in a foreground run), where the
server's death is the EOF the launcher reports.
"""

from __future__ import annotations

import os
import sys

from gofer import syscalls as sc
from sandbox.executor.wire import SOCKET
from sandbox.server import requests
from sandbox.server.cache import filter_cache
from sandbox.server.prefault import QUIET_MS, own_pages
from sandbox.server.requests import decline, handle
from sandbox.server.trust import root_only_dir, trusted_peer

TYPE_CHECKING = False  # typing's flag without importing typing; mypy reads it as True
if TYPE_CHECKING:
    import socket

MAX_CHILDREN = 64  # hooks and verbs served at once; more are told to do the work themselves
MAX_WAITING = 256  # connections whose request has not come yet; more are told so too
REQUEST_TIMEOUT = 2.0  # s for a client to send its request (ours send it right after connect)
SPARE = "sandbox-spare"  # a spare child's name (ps, /proc/PID/comm) until it is handed a request
LINGER = 0.2  # s a leaving server still accepts, its socket gone: a client that found it just before is served


def serve(args, main) -> int:
    """`sandbox serve [--server PATH]` (or `sandbox hook serve`): listen until SIGTERM or SIGINT.
    ``main`` is the CLI's (sandbox/cli.py): a served verb's child runs it.

    The loop never waits on a peer (issue #29: a peer we declined cost it 0.1 s, and 60 that
    never sent stalled every verb for seconds): an untrusted peer is answered without a
    wait, whatever it has sent; a trusted one waits in a poll set until its request comes
    (then the spare, or a child forked for it, takes it) or REQUEST_TIMEOUT passes (then it is
    closed)."""
    import signal

    from gofer import seccomp
    from mounts.errors import SandboxError

    plain = args.verb == "serve"  # (`hook serve` has none of serve's own flags)
    if plain and args.once:
        return requests.serve_once(main)
    idle = args.idle_exit if plain else 0
    listener = _activated()
    # a client's start (sandbox/executor/server_connect.h): its request waits in our queue, so the
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
    filter_cache(path)
    from mounts import inventories
    from sandbox.executor.build import entry_code

    _cap_log()
    code = _code_files()
    requests.PROGRAM, watch = entry_code(), _CodeWatch(code)

    # the inventories our children discover come back here, for the children forked after
    reports, inventories.REPORT = inventories.report_pair()
    print(f"sandbox serve: listening on {path}", file=sys.stderr, flush=True)

    def stop(_signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    loop = None
    try:
        loop = _Loop(listener, path, idle, reports, watch, lazy, main)
        loop.run()
        return 0
    except SandboxError as e:
        print(f"sandbox serve: {e}", file=sys.stderr)
        return 1
    finally:
        _unbind(path)  # (before the listener closes: no client may find a socket nobody answers)
        listener.close()
        if loop is not None:
            loop.close()
        if idle and seccomp.CACHE:
            import shutil

            shutil.rmtree(seccomp.CACHE, ignore_errors=True)  # (a client's start: nothing of it stays)
            try:
                os.rmdir(os.path.dirname(seccomp.CACHE))  # (another server's may be there still)
            except OSError:
                pass


class _Loop:
    """The accept loop: the listener, the connections whose request has not come yet (in
    the order they came, each with its deadline), and when to leave (idle, or upgraded)."""

    def __init__(self, listener, path: str, idle: int, reports, watch: _CodeWatch, lazy: bool, main):
        import select
        import signal
        import time

        self.listener, self.path, self.idle, self.reports, self.main = listener, path, idle, reports, main
        self.watch, self.lazy = watch, lazy
        listener.setblocking(False)
        self.poll = select.poll()
        self.poll.register(listener, select.POLLIN)
        # Each signal also wakes the poll through this pipe: CPython runs a handler once the
        # poll says EINTR, and one that comes while another's handler runs (SIGTERM during
        # SIGCHLD's) would wait, unseen, in a poll re-entered from C (the server ignored such
        # a SIGTERM)
        self.wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake[1], warn_on_full_buffer=False)
        self.poll.register(self.wake[0], select.POLLIN)
        self.waiting: dict[int, tuple] = {}  # fd -> (connection, deadline), in the order they came
        self.busy = time.monotonic()  # (idle: the last time a request or child was there)
        self.leaving: float | None = None  # when our socket went
        self.spare: tuple[int, socket.socket] | None = None  # (pid, our end of its socketpair): see _respawn
        if not lazy:
            self._respawn()

    def run(self) -> None:
        import time

        from mounts import inventories

        while True:
            events = self.poll.poll(self._timeout())
            if _children or self.waiting:
                self.busy = time.monotonic()
            if not (events or self.waiting or _children) and self._done():
                return
            for fd, _events in events:
                if fd == self.listener.fileno():
                    self._accept()
                elif fd in self.waiting:
                    self._take(fd)
                elif fd == self.wake[0]:  # (emptied: the handlers themselves run between bytecodes)
                    try:
                        while os.read(self.wake[0], 256):
                            pass
                    except BlockingIOError:
                        pass
            if self.spare is None and not _children:  # (never beside a child at work: it would slow it)
                inventories.receive(self.reports)  # (theirs, all sent: a spare has what they found)
                self._respawn()
            now = time.monotonic()
            while self.waiting and next(iter(self.waiting.values()))[1] <= now:  # (deadlines in order: one timeout)
                fd, (conn, _) = next(iter(self.waiting.items()))
                del self.waiting[fd]
                self.poll.unregister(fd)
                conn.close()

    def _timeout(self) -> int | None:
        """The poll's: to the first deadline, the linger's end, or idle's (ms)."""
        import time

        if self.waiting:
            end = next(iter(self.waiting.values()))[1]
        elif self.leaving is not None:
            end = self.leaving + LINGER
        elif self.idle and not _children:
            end = self.busy + self.idle
        else:
            return None
        return max(0, int((end - time.monotonic()) * 1000) + 1)

    def _done(self) -> bool:
        """Nothing there: whether to leave (the linger over); idle, the socket goes first, and
        those already queued on it are served."""
        import time

        now = time.monotonic()
        if self.leaving is not None:
            return now >= self.leaving + LINGER  # (what came before the socket went, and while it lingered, is served)
        if self.idle and now >= self.busy + self.idle:
            print(f"sandbox serve: idle {self.idle} s: leaving", file=sys.stderr, flush=True)
            _unbind(self.path)
            self.leaving = now
        return False

    def _accept(self) -> None:
        """Every connection queued: declined at once, or waiting for its request."""
        import select
        import time

        for conn in _accept_all(self.listener):
            if not trusted_peer(conn):
                decline(conn, "the server serves only root with CAP_SYS_ADMIN in its namespaces and root")
            elif self.watch.changed():
                decline(conn, "the server's code changed since it started (an upgrade): it leaves")
                _unbind(self.path)
                self.leaving = self.leaving or time.monotonic()
            elif len(self.waiting) >= MAX_WAITING:
                decline(conn, f"{MAX_WAITING} connections wait for their request")
            else:
                self.waiting[conn.fileno()] = (conn, time.monotonic() + REQUEST_TIMEOUT)
                self.poll.register(conn, select.POLLIN)
                continue
            conn.close()

    def _take(self, fd: int) -> None:
        """The request waiting on ``fd``: a child for it (none for a peer that left)."""
        from mounts import inventories

        conn = self.waiting.pop(fd)[0]
        self.poll.unregister(fd)
        with conn:
            if not _has_request(conn):
                return
            inventories.receive(self.reports)  # (what children sent since)
            _cap_log()
            if len(_children) >= MAX_CHILDREN:  # never a wait here: slow clients holding every child must
                decline(conn, f"{MAX_CHILDREN} requests are being served")  # not stop the others
            elif not self._hand_over(conn):
                try:
                    _fork_child(self._others(), self.wake, self.main, conn=conn)
                except OSError as e:  # (pids.max, memory: the launcher does the work itself)
                    decline(conn, f"cannot fork a child: {e.strerror}")
            if self.lazy:  # (and their files, as they are now; the rest as they were at our start)
                _preload()
                self.watch.add([f for f in _code_files() if f not in self.watch.files])
                self.lazy = False

    def _others(self) -> list:
        """What a child closes: the listener, the reports' end, the code's watch, the
        connections still waiting, the spare's socketpair."""
        return [self.listener, self.reports, self.watch, *(c for c, _ in self.waiting.values()),
                *([self.spare[1]] if self.spare else [])]

    def close(self) -> None:
        """The spare leaves with us, killed (it was handed nothing; a stopped one would not
        read its EOF) and waited for: nothing of ours stays behind."""
        import signal

        if self.spare is None:
            return
        pid = self.spare[0]
        self._respawn(fork=False)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # (unreaped, its pid is no one else's)
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # (reaped already)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})

    def _respawn(self, fork: bool = True) -> None:
        """A new spare (the old one, if any, leaves): a child forked ahead of the next request,
        which waits for its connection on a socketpair of its own (a fork is ~1.7 ms of a
        served verb here, off its path so). Forked after the preload, and only while no child
        is at work, their reports received: it starts with what a child forked then would."""
        import socket

        if self.spare is not None:
            self.spare[1].close()  # (its EOF: it leaves)
            self.spare = None
        if fork and not self.lazy and self.leaving is None:
            try:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            except OSError:
                return  # (out of fds: the next request forks its child)
            pid = _fork_child([*self._others(), ours], self.wake, self.main, hand=theirs)
            theirs.close()
            self.spare = (pid, ours) if pid else None
            if not pid:
                ours.close()

    def _hand_over(self, conn) -> bool:
        """Give ``conn`` to the spare; False where there is none, or it died or was stopped (then fork)."""
        import signal
        import socket

        if self.spare is None:
            return False
        pid, hand = self.spare
        self.spare = None
        # SIGCHLD held until the child is counted (see _fork_child); a spare that died
        # closed its end: the send fails, never counted
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            if pid in _stopped:  # (SIGSTOP'd, it would hold the request: killed, and a child forked)
                os.kill(pid, signal.SIGKILL)
                return False
            socket.send_fds(hand, [b"c"], [conn.fileno()])
            _children.add(pid)
            return True
        except OSError:
            return False
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            hand.close()


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
    """Our packages' directories (their subpackages' too: an upgrade renames into them) and
    every module of theirs loaded so far (the server's, preloaded: the ones its children run)."""
    import gofer
    import mounts
    import sandbox

    tops = tuple(os.path.dirname(p.__file__ or "") + "/" for p in (sandbox, gofer, mounts))
    files = sorted(f for m in list(sys.modules.values())
                   if isinstance(f := getattr(m, "__file__", None), str) and f.startswith(tops))
    return [*dict.fromkeys([*(t.rstrip("/") for t in tops), *sorted({os.path.dirname(f) for f in files})]), *files]


class _CodeWatch:
    """Whether our code changed since we started (an upgrade renames into its directories or
    rewrites a file): a server that kept the code it started with would serve the new
    installation's clients with the old code. Asked at each connection: an inotify fd on its
    directories, read without waiting (a syscall, where comparing ~85 files' stamps took
    0.2-0.6 ms of every verb); where inotify is refused (instances are few), the stamps."""

    def __init__(self, files: list[str]):
        self.files: list[str] = []
        self.stamp: list[tuple[int, int, int]] = []
        self.fd: int | None = None
        self.moved = False
        try:
            self.fd = sc.inotify_init()
        except OSError:
            pass
        self.add(files)

    def add(self, files: list[str]) -> None:
        """Watch ``files`` (and the directories among them) too, as they are now."""
        if self.fd is not None:
            try:
                for path in files:
                    if not path.endswith(".py"):  # (a file's changes are its directory's events)
                        sc.inotify_add(self.fd, path)
                self.files += files
                return
            except OSError:  # (out of watches: what it saw so far kept, the stamps from now on)
                self.changed()
                os.close(self.fd)
                self.fd = None
                files, self.files = self.files + files, []
        self.files += files
        self.stamp += _code_stamp(files)

    def close(self) -> None:
        """(In a child: the server's alone.)"""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def changed(self) -> bool:
        if not self.moved:
            if self.fd is not None:
                try:
                    self.moved = bool(os.read(self.fd, 4096))
                except BlockingIOError:
                    pass
            else:
                self.moved = _code_stamp(self.files) != self.stamp
        return self.moved


def _code_stamp(files: list[str]) -> list[tuple[int, int, int]]:
    """``files`` as they are now (inode, mtime, size)."""
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


def _fork_child(others: list, wake: tuple[int, int], main, conn=None, hand=None) -> int:
    """A child for the request waiting on ``conn`` (trusted), or a spare that waits for its connection on ``hand``: its
    pid (0: none forked). ``others``: the listener and the connections still waiting, closed
    in the child with the signal pipe ``wake`` (a copy held there would keep the EOF of its
    server child's death from its client)."""
    import signal

    if conn is not None:
        conn.settimeout(REQUEST_TIMEOUT)
    # SIGCHLD held until the child is counted: reaped before it was added, its pid would
    # stay in _children for good, and MAX_CHILDREN of those stop the server
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        child = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        if conn is None:
            return 0  # (no spare: the next request forks its child)
        raise
    if child == 0:
        code = 1
        try:  # (from the first bytecode: a SIGTERM now must not run the server's exit, its socket's removal)
            signal.set_wakeup_fd(-1)
            for fd in wake:
                os.close(fd)
            for other in others:
                other.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            conn = conn or _handed(hand)
            code = handle(conn, main) if conn is not None else 0
        except BaseException as e:  # never back into the accept loop
            print(f"sandbox serve: {e}", file=sys.stderr)
        finally:
            os._exit(code)
    if conn is not None:
        _children.add(child)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return child


def _handed(hand):
    """A spare's connection, as the server hands it over; None where the server closed its
    end instead (it left, or forked a fresher spare). Waiting, it makes the server's memory
    its own once the node is likely quiet again (sandbox/server/prefault.py): its request
    then pays no copy-on-write faults."""
    import select
    import signal
    import socket

    import prctl

    for sig in (signal.SIGTERM, signal.SIGINT):  # (waiting, a spare leaves as a signal says)
        signal.signal(sig, signal.SIG_DFL)
    name = prctl.get_name()
    prctl.set_name(SPARE)
    waiting = select.poll()
    waiting.register(hand, select.POLLIN)
    if not waiting.poll(QUIET_MS):  # (its request, or the server's EOF, meanwhile: no copy)
        try:
            own_pages(lambda: bool(waiting.poll(0)))
        except Exception as e:  # (a way to be faster: never the reason a request goes unserved)
            print(f"sandbox serve: spare: no copy of the server's memory: {e}", file=sys.stderr, flush=True)
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(hand, 1, 1, socket.MSG_CMSG_CLOEXEC)
    except OSError:
        fds = []
    finally:
        hand.close()
    if not fds:
        return None
    prctl.set_name(name)
    conn = socket.socket(fileno=fds[0])
    conn.settimeout(REQUEST_TIMEOUT)
    return conn


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

    os.close(root_only_dir(os.path.dirname(path), f"--server {path}", "another user could take the socket's place"))
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


_bound: dict[str, int] = {}  # socket path -> the inode we bound there
_children: set[int] = set()
_stopped: set[int] = set()  # children stopped (SIGSTOP) since they were forked


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
    import sandbox.trace  # noqa: F401
    from gofer import embed, enter, gpu, main, remote_init, root, seccomp, spans, systemd  # noqa: F401
    from mounts import atomic, bundle, driver, elf, ldcache, plan, request, spec  # noqa: F401
    from sandbox import api, launch  # noqa: F401
    from sandbox.executor import create_plan, exec_plan  # noqa: F401
    from sandbox.verbs import cdi, create, delete, exec, features, hook, run, start, state, update  # noqa: F401


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSTOPPED(status):
            _stopped.add(pid)
            continue
        _children.discard(pid)
        _stopped.discard(pid)
