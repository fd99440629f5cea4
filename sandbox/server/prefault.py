"""The spare's own copy of the server's memory, made while it waits for its request.

A forked child shares the server's pages copy-on-write, and Python writes to every object it
touches (its reference count): each such page then costs the child a fault and a copy on its
request's path (~450 of them for a served verb here, ~700 for a GPU hook: 1-2 ms). The spare
(sandbox/server/listen.py) is idle until its request comes, so it copies them first: every
page of a private writable mapping that is present and still shared (/proc/self/pagemap),
one madvise(MADV_POPULATE_WRITE) per run of present pages, which copies as a write would
(and leaves a page already ours alone), without a fault each. Pages the server never touched
are not made. It starts QUIET_MS after its birth, and between batches it stops as soon as
``stop()`` says its request (or the server's EOF) is there: a request waits for one batch at
most (~0.5 ms), and one that comes sooner finds a spare that faults as before. Where the
kernel lacks it (before 5.14) or /proc says nothing, nothing is copied.
"""

from __future__ import annotations

import errno
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
PRESENT, EXCLUSIVE = 1 << 63, 1 << 56  # pagemap's bits: the page is there; mapped by us alone


def own_pages(stop: Callable[[], bool]) -> int:
    """Copy every private writable page we still share (with the process we were forked
    from) into our own; how many were copied. Stops once ``stop()`` is true."""
    try:
        with open("/proc/self/maps") as f:
            ranges = [(int(a, 16), int(b, 16)) for a, _, b in
                      (line.split(None, 1)[0].partition("-") for line in f if line.split(None, 2)[1] == "rw-p")]
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, IndexError, ValueError):
        return 0
    copied = 0
    try:
        for start, end in ranges:
            for first in range(start, end, BATCH * PAGE):
                if stop():
                    return copied
                entries = array("Q", os.pread(pagemap, min(BATCH, (end - first) // PAGE) * 8, first // PAGE * 8))
                for run_start, run_end in _runs(entries):
                    try:
                        sc.madvise(first + run_start * PAGE, (run_end - run_start) * PAGE, sc.MADV_POPULATE_WRITE)
                    except OSError as e:
                        if e.errno == errno.EINVAL:  # a kernel without it
                            return copied
                        continue  # (unmapped meanwhile, or not to be written: left to fault)
                    copied += run_end - run_start
    except OSError:
        return copied
    finally:
        os.close(pagemap)
    return copied


def _runs(entries: array) -> list[tuple[int, int]]:
    """The [start, end) runs of present pages among pagemap ``entries`` that hold a shared
    one (a page of ours already is left as it is: one call for both, none for pages never
    made)."""
    runs: list[tuple[int, int]] = []
    start, shared = None, False
    for i, e in enumerate(entries):
        if e & PRESENT:
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
