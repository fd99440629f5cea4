"""Unix sockets for fault tests: clients that connect and say nothing, until the listener's
queue (or a count) is full."""

from __future__ import annotations

import contextlib
import socket


def silent_clients(path, kind: int, most: int = 1 << 16) -> list[socket.socket]:
    """Connect up to ``most`` clients of ``kind`` to ``path`` that never send; stops where
    the listen queue is full (a non-blocking connect then says EAGAIN). Close them after."""
    clients = []
    for _ in range(most):
        c = socket.socket(socket.AF_UNIX, kind)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            break
        clients.append(c)
    return clients


@contextlib.contextmanager
def full_listener(path, kind: int):
    """A listener at ``path`` with listen(0) that never accepts, its queue already full of
    silent clients: a connect to it waits (or says EAGAIN); all closed after."""
    listener = socket.socket(socket.AF_UNIX, kind)
    listener.bind(str(path))
    listener.listen(0)
    fillers = silent_clients(path, kind)
    try:
        yield listener
    finally:
        for f in fillers:
            f.close()
        listener.close()
