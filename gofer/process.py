"""What the container's process is made of, looked up and checked in Python for the executor
(sandbox/executor/process.c sets it up as runc's init does; gofer/frontend_plan.py writes its records):
capabilities by number, the LSM labels this kernel has, the console socket, the cwd and HOME
from the image (docs/design.md, "The process"; tests/integration/test_runc_parity.py compares
the result with runc's)."""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

import msgspec
import prctl

from gofer import syscalls as sc
from mounts.errors import ProcessError
from mounts.spec import CAP_NUMBERS, Capabilities, Personality, Process

NO_CAPABILITIES = Capabilities()
DEFAULT_UMASK = 0o022  # runc's, whatever the caller's was
MAX_PASSWD = 4 << 20


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return prctl.CAP_LAST_CAP


LAST_CAP = _last_cap()  # read now: after pivot_root /proc may be another (or none)


def _cap_numbers(names: list[str], field: str) -> set[int]:
    """The numbers of ``names`` (checked when the spec was parsed) that this kernel has;
    one it does not know is left out, as runc leaves it out."""
    caps = set()
    for name in names:
        number = CAP_NUMBERS.get(name.upper())
        if number is None:
            raise ProcessError(f"process.capabilities.{field}: unknown capability {name!r}", code=2)
        if number <= LAST_CAP:
            caps.add(number)
    return caps


def apparmor() -> bool:
    try:
        with open("/sys/module/apparmor/parameters/enabled") as f:
            return f.read().startswith("Y")
    except OSError:
        return False


def selinux() -> bool:
    return os.path.exists("/sys/fs/selinux/enforce")


def check_labels(proc: Process, mount_label: str | None = None) -> None:
    """The security labels the spec asks for must exist in this kernel: a profile that
    silently does not apply is a container less confined than its author was told (runc
    refuses an SELinux label without SELinux too). Checked before anything is built."""
    if proc.apparmor_profile and not apparmor():
        raise ProcessError(f"process.apparmorProfile {proc.apparmor_profile!r}: AppArmor is not enabled in "
                           "this kernel", code=2)
    if proc.selinux_label and not selinux():
        raise ProcessError(f"process.selinuxLabel {proc.selinux_label!r}: SELinux is not enabled in this "
                           "kernel", code=2)
    if mount_label:
        raise ProcessError(f"linux.mountLabel {mount_label!r}: " + (
            "SELinux mount labels are not supported" if selinux() else "SELinux is not enabled in this kernel"), code=2)


def scheduling_part(proc: Process, personality: Personality | None,
                    part: str) -> tuple[Process, Personality | None] | None:
    """What ``part`` of set_scheduling applies: the process and personality with the rest
    left out, or None for nothing (gofer/frontend_plan.py plans the same parts for C)."""
    deadline = proc.scheduler is not None and proc.scheduler.policy == "SCHED_DEADLINE"
    if part == "late":
        return (msgspec.structs.replace(proc, io_priority=None), None) if deadline else None
    if part == "early" and deadline:
        return msgspec.structs.replace(proc, scheduler=None), personality
    return proc, personality


def connect_console(path: str) -> socket.socket:
    """The --console-socket, connected while its host path is still visible (before any
    namespace is joined or the root moves)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    # a deadline on every wait: a listener whose queue is full refuses at once (EAGAIN, as
    # runc fails), one that never reads the pty's fd holds us CONSOLE_TIMEOUT at most
    s.settimeout(CONSOLE_TIMEOUT)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        why = e.strerror or "timed out"
        raise ProcessError(f"--console-socket {path}: cannot connect: {why}", op="connect", path=path) from None
    return s


CONSOLE_TIMEOUT = 10.0  # s


def _in_root(unsafe_path: str, flags: int) -> int:
    """Open a path of the image's inside our root (the container's, past pivot_root or
    setns): no symlink or ``..`` leaves it, no magic link (/proc/self/fd/N: a caller's fd,
    the CVE-2024-21626 way out) is followed."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return sc.openat2(root, unsafe_path.lstrip("/") or ".", flags, sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_MAGICLINKS)
    finally:
        os.close(root)


def home_of(uid: int) -> str:
    """The home directory of ``uid`` in the container's /etc/passwd, else "/" (runc's rule).
    Read after pivot_root, resolved inside the root without magic links, non-blocking,
    regular files only, size capped: the image's passwd is untrusted input."""
    try:
        path = _in_root("/etc/passwd", os.O_PATH)
        try:
            fd = sc.open_regular(path)
        finally:
            os.close(path)
    except OSError:
        return "/"
    if fd is None:
        return "/"
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PASSWD)
    for line in data.split(b"\n"):
        fields = line.split(b":")
        if len(fields) >= 6 and fields[2] == str(uid).encode() and fields[5]:
            try:
                return fields[5].decode()
            except UnicodeDecodeError:
                break
    return "/"


class Entry(NamedTuple):
    """What the process takes from the image, looked up as root inside the root before the
    user changes and before any seccomp filter is loaded (a profile may well deny openat2)."""

    cwd: int  # O_PATH fd of process.cwd: the executor enters it (sandbox/executor/process.c)
    home: str


def look_up(proc: Process) -> Entry:
    """Resolve process.cwd inside the root without magic links (CVE-2024-21626): its fd,
    which the executor enters as root first, as runc does (a cwd the user may not search, a
    0700 /root, is still the process's), and HOME."""
    try:
        cwd = _in_root(proc.cwd, os.O_PATH | os.O_DIRECTORY)
    except OSError as e:
        raise ProcessError(f"process.cwd {proc.cwd}: {e.strerror}") from None
    env = dict(item.partition("=")[::2] for item in proc.env)
    return Entry(cwd, env["HOME"] if "HOME" in env else home_of(proc.user.uid))


def environment(proc: Process, entry: Entry) -> dict[str, str]:
    """What the process execs with: the spec's env alone (the last of a name wins), HOME as
    looked up (sandbox/executor/exec_plan.py sends the same to the C front end)."""
    env = dict(item.partition("=")[::2] for item in proc.env)
    env["HOME"] = entry.home
    return env
