"""Removing the cgroups we made: deepest first, waiting out the reaping of the last process,
also from a process whose view of the host's cgroup mounts is about to go (Pinned)."""

from __future__ import annotations

import errno
import os

from gofer.cgroups.common import hierarchy


def remove_dirs(dirs: list[str], patience: float = 2.0) -> None:
    """rmdir the cgroups we created, deepest first. A cgroup is busy until its last process
    is reaped (a zombie still counts): retried for ``patience`` seconds, then left."""
    _rmdir_all([(None, d) for d in sorted(dirs, key=len, reverse=True)], patience)


def _rmdir_all(entries: list[tuple[int, str]] | list[tuple[None, str]], patience: float) -> None:
    import time

    deadline = time.monotonic() + patience
    for dir_fd, path in entries:
        while True:
            try:
                os.rmdir(path, dir_fd=dir_fd)
            except OSError as e:
                if e.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                if e.errno not in (errno.ENOENT, errno.EBUSY):
                    raise
            break


class Pinned:
    """The cgroups we created, held by fds opened now, for a process whose view of the host
    is about to go (the gofer: pid 1's pivot_root in the mount namespace they share detaches
    the host's cgroup mounts from it). remove() leaves them and removes them."""

    def __init__(self, dirs: list[str]):
        self.entries = [(os.open(os.path.dirname(d), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                         os.path.basename(d)) for d in sorted(dirs, key=len, reverse=True)]
        self.roots = [os.open(os.path.join(h, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
                      for h in {hierarchy(d) for d in dirs}]

    def close(self) -> None:
        """In the forked init, which must not keep them."""
        for fd in self.roots + [fd for fd, _name in self.entries]:
            os.close(fd)

    def remove(self) -> None:
        for fd in self.roots:  # out of them first: we are in them too
            try:
                os.write(fd, str(os.getpid()).encode())
            except OSError:
                pass
        _rmdir_all(self.entries, 2.0)
