"""What /proc says of a process that we keep: its start time."""

from __future__ import annotations

import os


def start_time(pid: int, pdir: int | None = None) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, what names one
    process for good, never a later one that got its number. None when there is no such
    live process (a zombie will never run again). Through ``pdir`` (an fd of /proc/PID)
    when given, so a pid reused meanwhile is not read."""
    try:
        fd = os.open("stat" if pdir is not None else f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC,
                     dir_fd=pdir)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = data[data.rfind(b")") + 2:].split()  # after "pid (comm) "
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def exit_code(status: int) -> int:
    """A wait status as runc reports it: the exit code, or 128+N when killed by signal N (the
    OOM killer's SIGKILL: 137)."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
