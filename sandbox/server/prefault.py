"""The spare's own copy of the server's memory, made while it waits for its request.

A forked child shares the server's pages copy-on-write, and Python writes to every object it
touches (its reference count): each such page then costs the child a fault and a copy on its
request's path (~450 of them for a served verb here, ~700 for a GPU hook: 1-2 ms). The spare
(sandbox/server/listen.py) is idle until its request comes, so it copies them first: every
page of a private writable mapping that is present and still shared (/proc/self/pagemap),
one madvise(MADV_POPULATE_WRITE) per run of present pages, which copies as a write would
(and leaves a page already ours alone), without a fault each. Pages never made, and those
only ever read (the kernel's shared zero page, known by its frame number), are left as they
are: no memory is made for them. It starts QUIET_MS after its birth, copies MAX_COPY at
most, and between batches stops as soon as ``stop()`` says its request (or the server's EOF)
is there: a request waits for one batch at most (~0.5 ms), and one that comes sooner finds a
spare that faults as before. Where the kernel lacks it (before 5.14), or pagemap hides frame
numbers (no CAP_SYS_ADMIN: the zero page could not be told), nothing is copied.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Callable

from gofer import syscalls as sc

# ms a new spare waits before it copies: it is forked as the request before it ends, while
# that request's caller goes on (runc's rest of a container's start after the hook: 20-30 ms
# here), and copying beside it slowed it by as much as it saved (runc + the warm hook: no
# gain copying at once, nor at SCHED_IDLE on the other core; 1.8 ms less waiting 50 ms)
QUIET_MS = 50
PAGE = os.sysconf("SC_PAGE_SIZE")
BATCH = 256  # pages read from pagemap, and copied, between two looks at stop()
MAX_COPY = 64 << 20  # bytes at most (the server's own are ~10 MiB); a bigger mapping is not even read
PRESENT, EXCLUSIVE, FRAME = 1 << 63, 1 << 56, (1 << 55) - 1  # pagemap's bits


def zero_frame() -> int | None:
    """The frame number of the kernel's shared zero page as our pagemap shows it; None where
    the kernel has no MADV_POPULATE_WRITE or pagemap hides frame numbers."""
    buf = mmap.mmap(-1, 2 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        addr = sc.buffer_address(buf)
        buf[0]  # (a read: the zero page)
        sc.madvise(addr + PAGE, PAGE, sc.MADV_POPULATE_WRITE)
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            read, written = array("Q", os.pread(fd, 16, addr // PAGE * 8))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    finally:
        buf.close()
    if not read & PRESENT or not written & PRESENT or read & FRAME in (0, written & FRAME):
        return None
    return read & FRAME


def own_pages(stop: Callable[[], bool]) -> int:
    """Copy the private writable pages we still share (with the process we were forked
    from) into our own; how many pages the copies went over. Stops once ``stop()`` is true."""
    zero = zero_frame()
    if zero is None:
        return 0
    try:
        with open("/proc/self/maps", "rb") as f:
            ranges = [(int(a, 16), int(b, 16)) for a, _, b in
                      (fields[0].partition(b"-") for fields in (line.split(None, 2) for line in f)
                       if len(fields) > 1 and fields[1] == b"rw-p")]
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return 0
    copied = 0
    try:
        for start, end in ranges:
            if end - start <= MAX_COPY:  # (else a reservation: reading its pagemap alone would take long)
                copied = _own_range(pagemap, start, end, zero, stop, copied)
    finally:
        os.close(pagemap)
    return copied


def _own_range(pagemap: int, start: int, end: int, zero: int, stop: Callable[[], bool], copied: int) -> int:
    """own_pages' work on the mapping [start, end): ``copied``, and what it copied added."""
    for first in range(start, end, BATCH * PAGE):
        if stop() or copied * PAGE >= MAX_COPY:
            break
        try:
            data = os.pread(pagemap, min(BATCH, (end - first) // PAGE) * 8, first // PAGE * 8)
        except OSError:
            break
        for run_start, run_end in _runs(array("Q", data[:len(data) - len(data) % 8]), zero):
            try:
                sc.madvise(first + run_start * PAGE, (run_end - run_start) * PAGE, sc.MADV_POPULATE_WRITE)
            except OSError:  # (a mapping it cannot populate, I/O or frame-mapped; or one unmapped meanwhile)
                return copied  # (the rest of it left to fault)
            copied += run_end - run_start
    return copied


def _runs(entries: array, zero: int) -> list[tuple[int, int]]:
    """The [start, end) runs of pages among pagemap ``entries`` that are present and not the
    zero page, and hold a shared one (a page of ours already is left as it is: one call for
    both; none for a page never made or only read)."""
    runs: list[tuple[int, int]] = []
    start, shared = None, False
    for i, e in enumerate(entries):
        if e & PRESENT and e & FRAME != zero:
            if start is None:
                start, shared = i, False
            shared = shared or not e & EXCLUSIVE
        elif start is not None:
            if shared:
                runs.append((start, i))
            start = None
    if start is not None and shared:
        runs.append((start, len(entries)))
    return runs
