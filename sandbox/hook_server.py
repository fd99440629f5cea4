"""A warm `sandbox hook`: a resident server that has imported everything once and forks a
child per hook, and the client side of it, which every hook tries first.

A hook is a new Python process per container: its interpreter and imports (msgspec, the
plan, the ELF reader) are ~20 ms of the ~25 it adds to `runc run`, its work ~5. With
`sandbox hook serve` running, the hook runs only the client below (no msgspec, no plan):
it sends its arguments and the container state over a unix socket and prints the answer.
Without a server (none started, or killed: the socket refuses) the hook does the work
itself, as before; nothing else changes.

    hook (client, per container)          server (resident)        child (per request)
    ----------------------------          -----------------        -------------------
    connect SOCKET  ----------------->    accept, peer uid 0?
    {"argv", "stdin"} --------------->    fork ---------------->   the hook's work, as
                                                                   `sandbox hook` does it
                    <------------------------------------------    {"code", "error"}
    print the error line, exit code

The child has the hook's environment, not the server's (PATH only) and works from "/":
what reaches it is what reaches a hook. Only root may connect (SO_PEERCRED); the socket
lives in a directory only root can enter.
"""

from __future__ import annotations

import os
import sys

SOCKET = "/run/gpu-sandbox/hook.sock"
MAX_REQUEST = 1 << 20


def _server_path(argv: list[str]) -> str:
    for i, a in enumerate(argv[:-1]):
        if a == "--server":
            return argv[i + 1]
    return SOCKET


def forward(argv: list[str]) -> int | None:
    """Have the server run this hook; None where no server listens (do it here)."""
    import _socket  # the C module alone: `socket` (enum, selectors) is 5 ms of a 15 ms hook

    from sandbox.jsonlite import dumps, loads

    path = _server_path(argv)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    try:
        state = sys.stdin.buffer.read()
        s.sendall(dumps({"argv": argv, "stdin": state.decode("utf-8", "surrogateescape")}).encode())
        reply = s.recv(MAX_REQUEST)
    finally:
        s.close()
    if not reply:
        print(f"sandbox hook: the hook server at {path} died before it answered", file=sys.stderr)
        return 1
    answer = loads(reply.decode())
    if answer["error"]:
        print(f"sandbox hook: {answer['error']}", file=sys.stderr)
    return answer["code"]


def serve(args) -> int:
    """`sandbox hook serve [--server PATH]`: listen until SIGTERM or SIGINT."""
    import signal
    import socket
    import struct

    from mounts.errors import SandboxError

    _preload()
    path = os.path.abspath(args.server or SOCKET)
    listener = _listen(path)
    print(f"sandbox hook serve: listening on {path}", file=sys.stderr, flush=True)

    def stop(_signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except InterruptedError:
                continue
            with conn:
                _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid != 0:
                    continue  # only root runs container runtimes' hooks
                child = os.fork()
                if child == 0:
                    listener.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    code = 1
                    try:
                        code = _handle(conn)
                    except BaseException as e:  # never back into the accept loop
                        print(f"sandbox hook serve: {e}", file=sys.stderr)
                    finally:
                        os._exit(code)
    except SandboxError as e:
        print(f"sandbox hook serve: {e}", file=sys.stderr)
        return 1
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


def _listen(path: str):
    import socket

    from mounts.errors import SandboxError

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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
    return listener


def _handle(conn) -> int:
    """In the forked child: one hook, answered on ``conn``."""
    import time

    from mounts.errors import SandboxError
    from sandbox import cli, hook_cmd
    from sandbox.jsonlite import dumps, loads

    t = time.monotonic()
    os.environ.clear()  # the hook's environment, which is PATH alone (hook_cmd.HOOK_ENV)
    os.environ.update(item.split("=", 1) for item in hook_cmd.HOOK_ENV)
    code, error, cid = 1, "", "?"
    try:
        request = loads(conn.recv(MAX_REQUEST).decode())
        args = cli.hook_args(request["argv"])
        if args is None:
            raise SandboxError(f"unsupported hook arguments {request['argv']!r}")
        state = request["stdin"].encode("utf-8", "surrogateescape")
        cid = str(loads(request["stdin"]).get("id", "?")) if request["stdin"].lstrip().startswith("{") else "?"
        cli._resolve(args)
        code = hook_cmd.run_hook(args, state)
    except (SandboxError, OSError) as e:
        code, error = (e.exit_code if isinstance(e, SandboxError) else 1), str(e)
    except (ValueError, KeyError, TypeError, UnicodeError) as e:
        error = f"bad request: {e}"
    conn.sendall(dumps({"code": code, "error": error}).encode())
    print(f"sandbox hook serve: {cid}: exit {code} in {(time.monotonic() - t) * 1e3:.1f} ms", file=sys.stderr)
    return 0


def _preload() -> None:
    """Everything a hook imports, once, here: each child starts with it loaded."""
    import sandbox.config  # noqa: F401
    import sandbox.hook_cmd  # noqa: F401
    import sandbox.trace  # noqa: F401
    from gofer import embed, gpu, root, spans  # noqa: F401
    from mounts import driver, elf, ldcache, plan, request, spec  # noqa: F401
    from sandbox import api  # noqa: F401


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
