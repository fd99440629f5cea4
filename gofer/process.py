"""The container process, set up as runc's init does it: rlimits, a new session, user and
groups, capabilities (none unless the spec grants them), umask, cwd, HOME, no_new_privs,
default signal dispositions, then exec with the spec's environment only (docs/design.md,
"The process"; tests/integration/test_runc_parity.py compares the result with runc's)."""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import socket
import stat
import struct
import termios

import prctl

from gofer import syscalls as sc
from mounts.errors import ExecError, ProcessError
from mounts.spec import CAP_NUMBERS, RLIM_MAX, Capabilities, Process

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


def set_rlimits(proc: Process) -> None:
    for rl in proc.rlimits:
        which = getattr(resource, rl.type)  # the name was checked when the spec was parsed
        # the spec's 2^64-1 is RLIM_INFINITY, which Python spells -1
        limits = tuple(resource.RLIM_INFINITY if v == RLIM_MAX else v for v in (rl.soft, rl.hard))
        try:
            resource.setrlimit(which, limits)
        except (ValueError, OSError) as e:
            raise ProcessError(f"process.rlimits: {rl.type} soft {rl.soft} hard {rl.hard}: "
                               f"{getattr(e, 'strerror', None) or e}") from None


def become(proc: Process, seccomp=None) -> None:
    """Switch to the spec's user with exactly the spec's capabilities; a spec without
    ``capabilities`` gets none at all, as under runc (all five sets empty). A seccomp filter
    (gofer/seccomp.py) is loaded here when no_new_privs is off, else by exec_process.

    Order matters: the bounding set is cut while we still hold CAP_SETPCAP; KEEPCAPS keeps
    the permitted set across setuid to a non-zero uid; then one capset(2) for effective,
    permitted and inheritable, and last ambient (needs the cap permitted and inheritable)."""
    if seccomp is not None and not proc.no_new_privileges:
        # without no_new_privs a filter needs CAP_SYS_ADMIN to load: load it while we still
        # have it, before the user and capabilities change (runc's order too)
        seccomp.load()
    caps = proc.capabilities or NO_CAPABILITIES
    keep = _cap_numbers(caps.bounding, "bounding")
    permitted = _cap_numbers(caps.permitted, "permitted")
    inheritable = _cap_numbers(caps.inheritable, "inheritable")
    effective = _cap_numbers(caps.effective, "effective")
    ambient = _cap_numbers(caps.ambient, "ambient")
    for cap in range(0, LAST_CAP + 1):
        if cap not in keep:
            prctl.capbset_drop(cap)
    prctl.set_keepcaps(True)
    user = proc.user
    try:
        os.setgroups(user.additional_gids)
        os.setgid(user.gid)
        os.setuid(user.uid)
    except OSError as e:
        raise ProcessError(f"process.user: uid {user.uid} gid {user.gid}: {e.strerror}") from None
    sc.capset(effective, permitted, inheritable)
    for cap in sorted(ambient & permitted & inheritable):
        sc.cap_ambient_raise(cap)
    prctl.set_keepcaps(False)


def connect_console(path: str) -> socket.socket:
    """The --console-socket, connected while its host path is still visible (before any
    namespace is joined or the root moves)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise ProcessError(f"--console-socket {path}: cannot connect: {e.strerror}", op="connect", path=path) from None
    return s


def open_console(console: socket.socket, proc: Process) -> None:
    """A new pty from the container's own devpts (called past pivot_root, or after joining
    its mount namespace): the master goes to the console socket (SCM_RIGHTS, as runc sends
    it), the slave becomes our stdio and controlling terminal in a new session, at once: a
    created init must let go of its creator's stdio pipes (containerd's shim waits for
    their EOF before it calls start)."""
    try:
        master, slave = os.openpty()
    except OSError as e:
        raise ProcessError(f"process.terminal: cannot open a pty in the container: {e.strerror} "
                           "(is devpts mounted at /dev/pts?)", op="openpty", path="/dev/ptmx") from None
    if proc.console_size:
        size = struct.pack("HHHH", proc.console_size.get("height", 0), proc.console_size.get("width", 0), 0, 0)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    try:
        socket.send_fds(console, [b"/dev/ptmx"], [master])
    finally:
        os.close(master)
        console.close()
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.close(slave)


def home_of(uid: int) -> str:
    """The home directory of ``uid`` in the container's /etc/passwd, else "/" (runc's rule).
    Read after pivot_root, resolved inside the root without magic links, non-blocking,
    regular files only, size capped: the image's passwd is untrusted input."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = sc.openat2(root, "etc/passwd", os.O_RDONLY | os.O_NONBLOCK,
                        sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_MAGICLINKS)
    except OSError:
        return "/"
    finally:
        os.close(root)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "/"
        data = f.read(MAX_PASSWD)
    for line in data.split(b"\n"):
        fields = line.split(b":")
        if len(fields) >= 6 and fields[2] == str(uid).encode() and fields[5]:
            try:
                return fields[5].decode()
            except UnicodeDecodeError:
                break
    return "/"


def exec_process(proc: Process, pdeathsig: bool = True, seccomp=None) -> None:
    """A new session, umask, cwd, HOME, no_new_privs, PDEATHSIG (credential changes cleared
    it), every signal back to its default and none blocked, then execvpe with the spec's
    environment only: nothing of ours, nothing of the caller's. Every fd above 2 is already
    close-on-exec (gofer/main.py), so nothing of the caller's reaches the container."""
    try:
        os.setsid()
    except OSError:
        pass  # already the leader of the session our console made
    os.umask(proc.user.umask if proc.user.umask is not None else DEFAULT_UMASK)
    try:
        os.chdir(proc.cwd)
    except OSError as e:
        raise ProcessError(f"process.cwd {proc.cwd}: {e.strerror}") from None
    env = dict(item.partition("=")[::2] for item in proc.env)
    if "HOME" not in env:
        env["HOME"] = home_of(proc.user.uid)
    if proc.no_new_privileges:
        prctl.set_no_new_privs(1)
    if pdeathsig:  # not for a created container: its init outlives the runtime that made it
        prctl.set_pdeathsig(signal.SIGKILL)
    # Ignored signals stay ignored across execve (Python ignores SIGPIPE and SIGXFSZ; a
    # caller may ignore more): the container starts with every disposition at its default.
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # signals the C library reserves (32, 33)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if seccomp is not None and proc.no_new_privileges:
        seccomp.load()  # last, so it filters the container and none of our own setup
    try:
        os.execvpe(proc.args[0], proc.args, env)
    except OSError as e:
        raise ExecError(f"exec {proc.args[0]}: {e.strerror}", op="exec", path=proc.args[0]) from None
