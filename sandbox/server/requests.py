"""One request, in a server's forked child (or the launcher's own planner, serve_once): read
it (with the fds sent along), check it, and run its verb as the launcher would have, with
the caller's stdio, cwd, umask and environment; or decline it, and the launcher does the
work itself. The exchange is drawn in sandbox/server/listen.py."""

from __future__ import annotations

import os

from sandbox.executor.wire import MAX_REQUEST, SERVED
from sandbox.server.trust import sealed, trusted_peer, unpack_cred

PROGRAM = ""  # the `sandbox` program our clients run (build.entry_code): another's is declined


def serve_once(main) -> int:
    """The launcher's own planner (sandbox/executor/launcher.c, where no server listens): the one
    request on fd 3, its end of a socketpair, served as a server's child serves it, in a
    session of our own (a ^C to the caller's process group is the container's to get)."""
    import socket

    from sandbox.executor.build import entry_code

    global PROGRAM
    PROGRAM = entry_code()
    os.setsid()
    conn = socket.socket(fileno=3)
    conn.set_inheritable(False)
    if not trusted_peer(conn):
        decline(conn, "a planner serves only root with CAP_SYS_ADMIN")
        return 0
    return handle(conn, main)


def receive(conn):
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


def handle(conn, main) -> int:
    """In the forked child: one request, answered on ``conn``."""
    from sandbox.jsonlite import loads

    data, fds = receive(conn)
    try:
        request = loads(data.decode())
    except (ValueError, UnicodeError):
        request = None
    if isinstance(request, dict) and request.get("program", PROGRAM) != PROGRAM:
        for fd in fds:
            os.close(fd)
        decline(conn, "a client of another installation of sandbox", read=False)
        return 0
    if isinstance(request, dict) and "verb" in request:
        return _run_verb(conn, request, fds, main)
    for fd in fds:
        os.close(fd)
    decline(conn, "a request the launcher does not send", read=False)
    return 0


def _run_verb(conn, request: dict, fds: list[int], main) -> int:
    """A verb of SERVED or a hook's call (or exec, create, run: planned for the launcher), as
    the launcher would have run it: its stdio, cwd, umask, environment."""
    import signal
    import time

    from sandbox import flags
    from sandbox.jsonlite import dumps

    t = time.monotonic()
    argv, cwd, umask, env = request.get("verb") or [], request.get("cwd"), request.get("umask"), request.get("env")
    at = flags.verb_index(argv) if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None
    verb = argv[at] if at is not None else None
    hook = at is not None and flags.hook_call(argv[at:])
    if hook and any(a == "--trace" or a.startswith("--trace=") for a in argv):
        decline(conn, "a hook's trace is the hook's own to write", read=False)
        return 0
    if not ((verb in SERVED or verb in ("exec", "create", "run") or hook) and isinstance(cwd, str) and isinstance(umask, int)
            and 0 <= umask <= 0o777 and isinstance(env, list) and all(isinstance(e, str) and "=" in e for e in env)
            and len(fds) == 3):
        decline(conn, "a request the launcher does not send", read=False)
        return 0
    try:
        os.chdir(cwd)
    except OSError as e:
        decline(conn, f"cwd {cwd}: {e.strerror}", read=False)
        return 0
    try:  # (now, in the server's namespaces: a hook's verb joins the container's mount namespace)
        null: int | None = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        null = None
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
        from sandbox.executor.exec_plan import Decline, Frontend

        frontend = Frontend(conn)
    elif verb in ("create", "run"):
        # create's gofer has the launcher fork the init (or the verb ends with an error's code);
        # a foreground run's child then waits for the launcher to report the container's end
        import socket

        if not sealed():  # (its builder enters the container's pid namespace: never a writable host file)
            os.dup2(log, 2)
            decline(conn, f"{verb}: the server's interpreter is not sealed (start it as `sandbox serve`)", read=False)
            return 0

        from sandbox.executor.create_plan import CreateFrontend
        from sandbox.executor.exec_plan import Decline

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
        decline(conn, f"{verb}: {e}", read=False)
        return 0
    _let_go_of_stdio(null)
    # our log's line first: once the caller has its answer (and its pipes' end), the line is there
    line = f"sandbox serve: {verb}: {' '.join(argv)[:300]}: exit {code} in {(time.monotonic() - t) * 1e3:.1f} ms\n"
    try:
        os.write(log, line.encode("utf-8", "replace"))
    except OSError:
        pass  # (a log that cannot take it: never the verb's failure)
    try:
        conn.sendall(dumps({"code": code}).encode())
    except OSError:
        pass  # (a run's launcher killed while it waited: its container went with it)
    return 0


def _let_go_of_stdio(null: int | None) -> None:
    """The caller's stdin, stdout and stderr flushed and given back (``null``, our /dev/null,
    in their place; closed here) before the verb's code goes: a caller that reads them to
    their end (Go's exec: runc's hooks, a shim's verbs; Python's capture) sees that end once
    the launcher exits, not once this process has gone too (the kernel closes a dying
    process's files after tearing down its memory: a served `list` read through pipes 4.6 ->
    3.6 ms here)."""
    from sandbox.messages import flush_stdio

    flush_stdio()
    for fd in (0, 1, 2):
        try:
            if null is None:
                os.close(fd)
            else:
                os.dup2(null, fd)
        except OSError:
            pass
    if null is not None:
        os.close(null)


def decline(conn, why: str, read: bool = True) -> None:
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

