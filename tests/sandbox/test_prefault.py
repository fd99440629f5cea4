"""The spare's copy of the server's memory (sandbox/server/prefault.py), on the real kernel:
a forked child that shares a buffer with its parent owns it afterwards, unchanged; pages only
ever read (the zero page) are not made."""

from __future__ import annotations

import mmap
import os
from array import array

import pytest

from gofer import syscalls as sc
from sandbox.server import prefault
from sandbox.server.prefault import EXCLUSIVE, FRAME, PAGE, PRESENT, _runs, own_pages, zero_frame

PAGES = 64
ZERO = zero_frame()
needs_it = pytest.mark.skipif(ZERO is None, reason="no MADV_POPULATE_WRITE (Linux 5.14), or pagemap hides frame "
                                                   "numbers (not root): nothing is copied there")


def _entries(addr: int, n: int) -> list[int]:
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        return list(array("Q", os.pread(fd, n * 8, addr // PAGE * 8)))
    finally:
        os.close(fd)


def _in_child(check, max_copy: int = 1 << 40) -> int:
    """Run ``check`` in a forked child, with MAX_COPY as given (by default none: a test
    process may have more than MAX_COPY of its own before the buffer); its exit code (0: it
    held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prefault.MAX_COPY = max_copy
            code = 0 if check() else 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def buffer():
    """A private anonymous buffer of PAGES pages and its address."""
    buf = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    yield sc.buffer_address(buf), buf
    buf.close()


@needs_it
def test_a_child_owns_the_pages_it_shared_and_they_hold_what_they_held(buffer):
    addr, buf = buffer
    data = bytes(range(256)) * (PAGES * PAGE // 256)
    buf.write(data)

    def check() -> bool:
        if not all(e & PRESENT and not e & EXCLUSIVE for e in _entries(addr, PAGES)):
            return False  # (the premise: shared with the parent)
        copied = own_pages(lambda: False)
        after = _entries(addr, PAGES)
        return copied >= PAGES and all(e & PRESENT and e & EXCLUSIVE for e in after) and buf[:] == data

    assert _in_child(check) == 0
    assert buf[:] == data


@needs_it
def test_pages_only_ever_read_are_not_made(buffer):
    """(One page written: the mapping is then copied whole at the fork, zero pages too.)"""
    addr, buf = buffer
    buf[0] = 1
    assert buf[PAGE:] == bytes((PAGES - 1) * PAGE)  # (each page read: the zero page)

    def check() -> bool:
        if not all(e & PRESENT and e & FRAME == ZERO for e in _entries(addr + PAGE, PAGES - 1)):
            return False  # (the premise: the child sees them so)
        own_pages(lambda: False)
        return all(e & FRAME == ZERO for e in _entries(addr + PAGE, PAGES - 1)) and _entries(addr, 1)[0] & EXCLUSIVE \
            and buf[PAGE:] == bytes((PAGES - 1) * PAGE)

    assert _in_child(check) == 0


@needs_it
def test_it_copies_max_copy_at_most(buffer):
    addr, buf = buffer
    buf.write(b"x" * PAGES * PAGE)

    def check() -> bool:
        return own_pages(lambda: False) <= 4 + prefault.BATCH  # (checked between batches)

    assert _in_child(check, max_copy=4 * PAGE) == 0


@needs_it
def test_it_stops_when_told_and_copies_nothing(buffer):
    addr, buf = buffer
    buf.write(b"x" * PAGES * PAGE)

    def check() -> bool:
        copied = own_pages(lambda: True)
        return copied == 0 and all(e & PRESENT and not e & EXCLUSIVE for e in _entries(addr, PAGES))

    assert _in_child(check) == 0


def test_runs_are_present_pages_holding_a_shared_one_and_skip_those_never_made_or_only_read():
    zero = 7
    shared, ours, absent, read = PRESENT | 100, PRESENT | EXCLUSIVE | 101, 0, PRESENT | zero
    entries = array("Q", [absent, shared, ours, shared, absent, ours, ours, absent, ours, shared, read, shared])
    assert _runs(entries, zero) == [(1, 4), (8, 10), (11, 12)]
    assert _runs(array("Q", [ours, ours, read]), zero) == []
    assert _runs(array("Q", []), zero) == []
