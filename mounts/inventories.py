"""The last discovery of each driver root, reused while nothing it read has changed.

A driver does not change between two containers, but discovering it is most of a GPU
container's own start-up (14 ms a container for the H200's driver). A long-lived process
(the warm server, an embedding runtime through sandbox.api) keeps each inventory with the
answers it was read from (mounts/reads.py) and, for the next container, asks the same
questions again: the same answers, the same inventory. What the questions cover: every
file, link and directory discovery looked at (its inode, size, times, mode and device
numbers: a library upgraded, a link moved, a device node made again), every listing of
/proc it made (a GPU or a MIG instance appearing or going), every /proc text it read (the
version, after a reload). Asking costs a stat a file, a fraction of discovering.

The warm server forks a child per request: a child that had to discover sends what it
found to the server (``REPORT``), which keeps it for the children it forks later.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec

from mounts import reads
from mounts.driver import discover
from mounts.driver_facts import Inventory

Key = tuple[str, str, str, str]  # driver root, device root, search path, PATH ("" for none)


class Kept(msgspec.Struct, frozen=True):
    """An inventory and the answers it was read from: what a child sends its server."""

    key: Key
    inventory: Inventory
    answers: list[tuple[str, str, Any]]  # (kind, path, answer): reads.Reads.answers


_kept: dict[Key, tuple[Inventory, reads.Reads]] = {}
REPORT: socket.socket | None = None  # a forked child's way to its server (sandbox/server/listen.py)
MAX_MESSAGE = 4 << 20


def inventory(root: str = "/", dev_root: str | None = None,
              search_path: str | None = None) -> tuple[Inventory, bool]:
    """discover()'s inventory, and whether it was kept from before (nothing it read changed)."""
    key = (root, dev_root or "", search_path or "", os.environ.get("PATH", "") if search_path is None else "")
    kept = _kept.get(key)
    if kept is not None and kept[1].unchanged():
        return kept[0], True
    with reads.recording() as answers:
        found = discover(root, dev_root, search_path)
    if answers.settled:
        _keep(key, found, answers)
        if REPORT is not None:
            _report(REPORT, Kept(key, found, [(k, p, a) for (k, p), a in answers.answers.items()]))
    else:
        _kept.pop(key, None)
    return found, False


def _report(sock: socket.socket, kept: Kept) -> None:
    try:
        data = msgspec.msgpack.encode(kept)
    except ValueError:  # (a file name that is no UTF-8, a lone surrogate in a listing: not kept there)
        return
    if len(data) <= MAX_MESSAGE:
        try:
            sock.send(data, socket.MSG_DONTWAIT)
        except OSError:
            pass  # (a server gone, or busy: the next child reports it again)


def receive(sock: socket.socket) -> None:
    """In the server: keep what its children sent (every message waiting, none waited for)."""
    while True:
        try:
            data = sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            return
        try:
            kept = msgspec.msgpack.decode(data, type=Kept)
        except (msgspec.DecodeError, ValueError):  # (never a reason for the server to stop)
            continue
        answers = reads.Reads()
        answers.answers = {(k, p): tuple(a) if isinstance(a, list) else a for k, p, a in kept.answers}
        if ("stat", kept.key[0]) not in answers.answers:  # (a discovery notes its root first: else no report of ours)
            continue
        _keep(tuple(kept.key), kept.inventory, answers)  # type: ignore[arg-type]


MAX_KEPT = 16  # driver roots (and PATHs) kept at once: the oldest goes first


def _keep(key: Key, found: Inventory, answers: reads.Reads) -> None:
    _kept.pop(key, None)
    _kept[key] = found, answers
    while len(_kept) > MAX_KEPT:
        del _kept[next(iter(_kept))]


def report_pair() -> tuple[socket.socket, socket.socket]:
    """(the server's end, its children's end): datagrams, one whole inventory each."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
    return ours, theirs
