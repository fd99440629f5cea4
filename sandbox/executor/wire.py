"""The warm server's wire, written once: the socket, the limits and deadlines both sides keep,
the verbs the launcher has served, and (c_header) the same as the C header the launcher and its
executor are built with (sandbox/executor/build.py writes it), so C and
Python can never disagree. The server is sandbox/server/listen.py; its one client the
launcher, sandbox/executor/launcher.c (with sandbox/executor/server_wire.h), for verbs and hooks alike; the
process plan's records are gofer/frontend_plan.py's."""

from __future__ import annotations

SOCKET = "/run/gpu-sandbox/hook.sock"  # the node's server (a hook's --server, else $SANDBOX_SERVER, else this)
MAX_REQUEST = 1 << 20  # bytes of one message either way
# s the launcher waits for the server's first answer ({"running"}, a plan, {"fallback"}), which
# its child sends at once (a create's once the bundle is read): past it, the verb runs in the
# launcher's Python (a server stopped, or stalled)
TAKE_UP_S = 5
REPORT_ANSWER_S = 30  # s exec's launcher waits for the answer to its report (the server writes the pid file)
SERVED = ("state", "kill", "delete", "start", "list", "ps", "features", "update")  # verbs that start no process


def c_string(text: str) -> str:
    """``text`` as a C string literal: printable ASCII as it is, every other byte in octal."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}" for b in text.encode()) + '"'


def c_header() -> str:
    """The above, and the plan's tables (gofer/frontend_plan.py), as C macros."""
    from gofer.frontend_plan import c_defines

    return (f"#define DEFAULT_SOCKET {c_string(SOCKET)}\n#define MAX_REQUEST {MAX_REQUEST}\n"
            f"#define TAKE_UP_S {TAKE_UP_S}\n#define REPORT_ANSWER_S {REPORT_ANSWER_S}\n"
            f"#define SANDBOX_SERVED {', '.join(map(c_string, SERVED))}\n{c_defines()}")
