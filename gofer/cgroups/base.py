"""The container's cgroup, the part both layouts share: its directories (one per hierarchy),
making them (and remembering which we made, so only those are removed), writing their
files, joining them."""

from __future__ import annotations

import os

from gofer.cgroups.common import Journal, write_file
from gofer.cgroups.remove import remove_dirs
from mounts.errors import SandboxError


class Base:
    """What both layouts share: the directories (one per hierarchy), making them (and
    remembering which we made, so only those are removed), writing their files, joining."""

    dirs: dict[str, str]

    def __init__(self) -> None:
        self.created: list[str] = []
        self.journal: Journal | None = None  # an update's: what each write changed, to put back

    def missing(self) -> list[str]:
        """The directories create() will make (those not there yet), parents first."""
        out: list[str] = []
        for d in dict.fromkeys(self.dirs.values()):
            chain = []
            while not os.path.isdir(d):
                chain.append(d)
                d = os.path.dirname(d)
            out += reversed(chain)
        return out

    def members(self) -> list[int]:
        """The processes already in the directories that exist (a cgroupsPath naming a
        cgroup someone else made)."""
        pids: set[int] = set()
        for d in dict.fromkeys(self.dirs.values()):
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids.update(int(p) for p in f.read().split())
            except OSError:
                pass
        return sorted(pids)

    def _mkdirs(self, d: str) -> list[str]:
        made = []
        for m in [m for m in self.missing() if m == d or d.startswith(m + "/")]:
            try:
                os.mkdir(m)
            except FileExistsError:
                continue
            except OSError as e:
                raise SandboxError(f"{m}: cannot create the cgroup: {e.strerror}") from None
            self.created.append(m)
            made.append(m)
        return made

    def _write(self, d: str, name: str, value: str, what: str = "") -> None:
        (self.journal.write if self.journal is not None else write_file)(d, name, value, what)

    def add(self, pid: int) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            self._write(d, "cgroup.procs", str(pid))

    def seal(self) -> None:
        """Called once every allow() is in: the rules take effect (v2: the program)."""

    def remove(self) -> None:
        remove_dirs(self.created)
