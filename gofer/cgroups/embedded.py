"""A container another runtime created (the hook, the Python API): only the GPU nodes added
to its device rules, and a way to undo that."""

from __future__ import annotations

import os
from collections.abc import Callable

from gofer.cgroups.common import ROOT, own_cgroups, own_unified, unified
from gofer.devfilter import Rule
from mounts.errors import MountError


class Grant:
    """GPU nodes allowed in a container's cgroup: ``undo()`` takes them back (a setup that
    failed afterwards), ``release()`` keeps them and closes the fds undoing would have used
    (a long-lived caller of sandbox.api would otherwise hold them for good)."""

    def __init__(self, undo: Callable[[], None], fds: list[int]):
        self._undo, self._fds = undo, fds

    def undo(self) -> None:
        undo, self._undo = self._undo, _nothing  # (once: never again through fds closed since)
        try:
            undo()
        finally:
            self.release()

    def release(self) -> None:
        fds, self._fds, self._undo = self._fds, [], _nothing
        for fd in fds:
            os.close(fd)


def _nothing() -> None:
    pass


def allow_devices(pid: int, nodes: list[tuple[int, int]]) -> Grant | None:
    """Allow read/write/mknod of each (major, minor) char device for ``pid``'s cgroup, which
    another runtime made: in its v1 devices controller, or on v2 by putting our rules in
    front of each device program attached to it (a program of ours alone could not widen
    what theirs allows: every program attached must allow a request). None where nothing
    was changed."""
    if not nodes:
        return None
    rules = [Rule(True, "c", major, minor) for major, minor in nodes]
    if unified():
        return _allow_v2(os.path.join(ROOT, own_unified(pid).lstrip("/")), rules)
    path = own_cgroups(pid, only="devices").get("devices")
    if path is None:
        return None
    directory = os.path.join(ROOT, "devices", path.lstrip("/"))

    def opened(name: str) -> int:
        target = os.path.join(directory, name)
        try:
            return os.open(target, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            raise MountError(target, f"cannot open to allow GPU devices: {e.strerror}") from None

    def write(fd: int, lines: list[str]) -> None:
        try:
            for line in lines:
                os.write(fd, line.encode())
        except OSError as e:
            raise MountError(directory, f"cannot change the GPU devices' rules: {e.strerror}") from None

    with open(os.path.join(directory, "devices.list")) as f:
        had = [line.split() for line in f.read().splitlines()]
    # only what no rule there allows already ("a *:* rwm" of a privileged container, "c 195:*
    # rwm"): the undo denies what we added, and must not take away what the container had
    added = [r.line() for r in rules if not any(
        t in ("a", "c") and num in ("*:*", f"*:{r.minor}", f"{r.major}:*", f"{r.major}:{r.minor}")
        and set("rwm") <= set(access) for t, num, access in (h for h in had if len(h) == 3))]
    if not added:
        return None
    deny = opened("devices.deny")  # now: past joining the container's mount namespace, no path leads here
    try:
        allow = opened("devices.allow")
        try:
            write(allow, added)
        finally:
            os.close(allow)
    except BaseException:
        os.close(deny)
        raise
    return Grant(lambda: write(deny, added), [deny])


def _allow_v2(directory: str, rules: list[Rule]) -> Grant | None:
    """Replace each device program attached to ``directory`` by ours-then-theirs; undone,
    theirs are put back."""
    from gofer import syscalls as sc
    from gofer.devfilter import allow_first

    try:
        cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(directory, f"cannot open the container's cgroup: {e.strerror}") from None
    swapped: list[tuple[int, int]] = []  # (their program, ours), both held until undone or released
    flags = 0
    try:
        flags, ids = sc.bpf_prog_query(cg, directory)
        for prog_id in ids:
            old, insns = sc.bpf_prog_instructions(prog_id, directory)
            new = -1
            try:
                new = sc.bpf_prog_load_device(allow_first(rules, insns), f"GPU device rules of {directory}")
                _swap(cg, flags, new, old, directory)
            except BaseException:
                for fd in (old, new):
                    if fd >= 0:
                        os.close(fd)
                raise
            swapped.append((old, new))
    except BaseException as e:
        _put_back(cg, flags, swapped, directory)
        _close(cg, swapped)
        if isinstance(e, OSError):
            raise MountError(directory, f"cannot allow GPU devices: {e}") from None
        raise
    if not swapped:
        os.close(cg)
        return None
    return Grant(lambda: _put_back(cg, flags, swapped, directory), [cg, *(fd for pair in swapped for fd in pair)])


def _swap(cg: int, flags: int, new: int, old: int, directory: str) -> None:
    from gofer import syscalls as sc

    if flags & sc.BPF_F_ALLOW_MULTI:
        sc.bpf_prog_attach(cg, new, sc.BPF_F_ALLOW_MULTI | sc.BPF_F_REPLACE, old, directory)
    else:  # a single program: attaching another replaces it
        sc.bpf_prog_attach(cg, new, flags, what=directory)


def _put_back(cg: int, flags: int, swapped: list[tuple[int, int]], directory: str) -> None:
    for old, new in reversed(swapped):
        try:
            _swap(cg, flags, old, new, directory)
        except OSError:
            pass  # the cgroup went with its container


def _close(cg: int, swapped: list[tuple[int, int]]) -> None:
    for fd in (cg, *(fd for pair in swapped for fd in pair)):
        os.close(fd)
