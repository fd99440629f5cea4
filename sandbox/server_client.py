"""The client's side of the warm server (sandbox/hook_server.py) in Python: the hook's
forwarding, which every `sandbox hook` tries first (the wire's numbers: sandbox/wire.py).
Only what a client needs: no msgspec, no plan, nothing of the server's."""

from __future__ import annotations

import os
import sys

from sandbox.wire import MAX_REQUEST, REPLY_TIMEOUT, SOCKET


def _server_path(argv: list[str]) -> str:
    for i, a in enumerate(argv[:-1]):
        if a == "--server":
            return argv[i + 1]
    return SOCKET


def forward(argv: list[str]) -> int | None:
    """Have the server run this hook; None where no server listens (do it here)."""
    import _socket  # the C module alone: `socket` (enum, selectors) is 5 ms of a 15 ms hook

    from sandbox.jsonlite import dumps, loads

    if "--trace" in argv:
        return None  # a trace is written by the hook itself, never by the server for it
    path = _server_path(argv)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        s.settimeout(1.0)  # a full listen queue or a server that does not accept: do it here
        s.connect(path)
        _pid, uid, _gid = unpack_cred(s.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))
        if uid != 0:
            raise OSError("the server is not root's")
        state = sys.stdin.buffer.read()
        sys.stdin = _replay(state)  # should the server be of no use, the hook reads it again here
        request = {"argv": argv, "stdin": state.decode("utf-8", "surrogateescape"), "cwd": os.getcwd()}
        if "-c" in sys.orig_argv:  # the program (launcher.entry_code): a server of another installation declines
            request["program"] = sys.orig_argv[sys.orig_argv.index("-c") + 1]
        s.sendall(dumps(request).encode())
        s.settimeout(REPLY_TIMEOUT)
        reply = s.recv(MAX_REQUEST)
    except OSError:
        # no server, not root's, a state too big for one message, no answer in time: do it
        # here (a server's child still at work holds the container: we wait, then see it done)
        return None
    finally:
        s.close()
    if not reply:
        print(f"sandbox hook: the hook server at {path} died before it answered", file=sys.stderr)
        return 1
    answer = loads(reply.decode())
    if answer.get("fallback"):
        return None  # the server declined: the hook does the work itself
    if answer["error"]:
        print(f"sandbox hook: {answer['error']}", file=sys.stderr)
    return answer["code"]


def unpack_cred(data: bytes) -> tuple[int, int, int]:
    return int.from_bytes(data[0:4], "little", signed=True), int.from_bytes(data[4:8], "little"), \
        int.from_bytes(data[8:12], "little")


def _replay(data: bytes):
    import io

    return io.TextIOWrapper(io.BytesIO(data))

