"""The spare's copy of the server's memory (sandbox/server/prefault.py), on the real kernel:
a forked child that shares a buffer with its parent owns it afterwards, unchanged."""

from __future__ import annotations

import ctypes
import mmap
import os
from array import array

import pytest

from sandbox.server.prefault import EXCLUSIVE, PAGE, PRESENT, _runs, own_pages

PAGES = 64


def _flags(addr: int, n: int) -> list[int]:
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        return list(array("Q", os.pread(fd, n * 8, addr // PAGE * 8)))
    finally:
        os.close(fd)


def _in_child(check) -> int:
    """Run ``check`` in a forked child; its exit code (0: it held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def shared_buffer():
    """A private buffer of PAGES pages, each written (present), and its address."""
    buf = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = bytes(range(256)) * (PAGES * PAGE // 256)
    buf.write(data)
    view = ctypes.c_char.from_buffer(buf)
    yield ctypes.addressof(view), buf, data
    del view
    buf.close()


def test_a_child_owns_the_pages_it_shared_and_they_hold_what_they_held(shared_buffer):
    addr, buf, data = shared_buffer

    def check() -> bool:
        before = _flags(addr, PAGES)
        if not all(e & PRESENT and not e & EXCLUSIVE for e in before):
            return False  # (the premise: shared with the parent)
        copied = own_pages(lambda: False)
        after = _flags(addr, PAGES)
        return copied >= PAGES and all(e & PRESENT and e & EXCLUSIVE for e in after) and buf[:] == data

    assert _in_child(check) == 0
    assert buf[:] == data


def test_it_stops_when_told_and_copies_nothing(shared_buffer):
    addr, _buf, _data = shared_buffer

    def check() -> bool:
        copied = own_pages(lambda: True)
        return copied == 0 and all(e & PRESENT and not e & EXCLUSIVE for e in _flags(addr, PAGES))

    assert _in_child(check) == 0


def test_runs_are_present_pages_holding_a_shared_one_and_skip_those_never_made():
    shared, ours, absent = PRESENT, PRESENT | EXCLUSIVE, 0
    entries = array("Q", [absent, shared, ours, shared, absent, ours, ours, absent, ours, shared])
    assert _runs(entries) == [(1, 4), (8, 10)]
    assert _runs(array("Q", [ours, ours])) == []
    assert _runs(array("Q", [])) == []
