"""Unix sockets for fault tests: clients that connect and say nothing, until the listener's
queue (or a count) is full."""

from __future__ import annotations

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
