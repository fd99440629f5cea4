"""The container process, set up as runc's init does it: rlimits, a new session, user and
groups, capabilities (none unless the spec grants them), umask, cwd, HOME, no_new_privs,
default signal dispositions, then exec with the spec's environment only (docs/design.md,
"The process"; tests/integration/test_runc_parity.py compares the result with runc's)."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import signal
import socket
import struct
import termios
from typing import NamedTuple

import msgspec
import prctl

from gofer import syscalls as sc
from mounts.errors import BundleError, ExecError, ProcessError
from mounts.spec import (
    CAP_NUMBERS,
    IOPRIO_CLASSES,
    PERSONALITY_DOMAINS,
    SCHED_FLAGS,
    SCHED_POLICIES,
    Capabilities,
    Personality,
    Process,
    Spec,
)

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


def fork_in_cgroup(spec: Spec, what: str) -> int:
    """os.fork for ``what``, we being in the container's cgroup: where its pids limit leaves
    no room for the processes the runtime makes there (runc's init forks none; our gofer
    forks pid 1), the limit is named, not the bare EAGAIN."""
    try:
        return os.fork()
    except BlockingIOError:
        r = spec.linux.resources
        limit = r.pids.limit if r is not None and r.pids is not None else 0
        if limit <= 0:
            raise
        raise BundleError(f"linux.resources.pids.limit: {limit} is too low for the runtime to start the container "
                          f"(its fork of {what} in the container's cgroup failed: {os.strerror(errno.EAGAIN)})") from None


def set_rlimits(proc: Process) -> None:
    """Each as the spec gives it (2^64-1 is RLIM_INFINITY, as the kernel spells it too);
    the kernel's refusal names the entry (a hard RLIMIT_NOFILE above fs.nr_open: EPERM)."""
    for i, rl in enumerate(proc.rlimits):
        which = getattr(resource, rl.type)  # the name was checked when the spec was parsed
        try:
            sc.setrlimit(which, rl.soft, rl.hard)
        except sc.SyscallError as e:
            raise ProcessError(f"process.rlimits[{i}]: {rl.type} soft {rl.soft} hard {rl.hard}: "
                               f"{os.strerror(e.errno)}", code=2) from None


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


def apply_labels(proc: Process) -> None:
    """The AppArmor profile or SELinux label the next execve takes on (what runc writes),
    through the container's /proc, as the last step before exec."""
    for label, paths in ((proc.apparmor_profile and f"exec {proc.apparmor_profile}",
                          ("thread-self/attr/apparmor/exec", "thread-self/attr/exec")),
                         (proc.selinux_label, ("thread-self/attr/exec",))):
        if not label:
            continue
        for path in paths:  # through the host's procfs: the container's /proc may be anything
            try:
                fd = sc.open_proc(path, os.O_WRONLY)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ProcessError(f"cannot apply {label!r} through /proc/{path}: {e.strerror}") from None
            try:
                os.write(fd, label.encode())
            except OSError as e:
                raise ProcessError(f"cannot apply {label!r} through /proc/{path}: {e.strerror}") from None
            finally:
                os.close(fd)
            break
        else:
            raise ProcessError(f"cannot apply {label!r}: no /proc/thread-self/attr here")


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


def set_scheduling(proc: Process, personality: Personality | None, part: str = "all") -> None:
    """process.scheduler, process.ioPriority and linux.personality, as runc applies them:
    while we still hold CAP_SYS_NICE (a real-time policy needs it), before the user changes.
    A task under SCHED_DEADLINE cannot fork: where a fork follows, ``part="early"`` leaves
    that policy out and ``part="late"`` (in the last process) applies it alone."""
    part_of = scheduling_part(proc, personality, part)
    if part_of is None:
        return
    proc, personality = part_of
    try:
        if proc.scheduler is not None:
            s = proc.scheduler
            sc.sched_setattr(SCHED_POLICIES[s.policy], sum(SCHED_FLAGS[f] for f in s.flags), s.nice, s.priority,
                             s.runtime, s.deadline, s.period)
        if proc.io_priority is not None:
            sc.ioprio_set(IOPRIO_CLASSES[proc.io_priority.class_], proc.io_priority.priority)
        if personality is not None:
            sc.personality(PERSONALITY_DOMAINS[personality.domain])
    except OSError as e:
        field = ("process.scheduler" if "sched" in str(e) else "process.ioPriority" if "ioprio" in str(e)
                 else "linux.personality")
        raise ProcessError(f"{field}: {e}") from None


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
    except OSError as e:
        raise ProcessError(f"--console-socket: cannot send the terminal: {e.strerror or 'timed out'}",
                           op="sendmsg", path="--console-socket") from None
    finally:
        os.close(master)
        console.close()
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.close(slave)


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

    cwd: int | None  # O_PATH fd of process.cwd still to enter as the user, None once entered
    home: str


def look_up(proc: Process, enter: bool = True) -> Entry:
    """Resolve process.cwd inside the root without magic links (CVE-2024-21626) and enter
    it by fd now, as root, as runc does first: a cwd the user may not search (a 0700 /root)
    is still the process's. Only where root is refused (a cwd the container's user owns on
    a root-squashing mount) does the user try, once it is the user. ``enter=False`` leaves
    the cwd's fd unentered (the exec front end enters it: sandbox/frontend.c)."""
    cwd: int | None  # None once we are in it (Entry.cwd)
    try:
        cwd = _in_root(proc.cwd, os.O_PATH | os.O_DIRECTORY)
    except OSError as e:
        raise ProcessError(f"process.cwd {proc.cwd}: {e.strerror}") from None
    try:
        if enter:
            os.fchdir(cwd)
    except PermissionError:
        pass
    else:
        if enter:
            os.close(cwd)
            cwd = None
    env = dict(item.partition("=")[::2] for item in proc.env)
    return Entry(cwd, env["HOME"] if "HOME" in env else home_of(proc.user.uid))


def _enter_cwd(proc: Process, entry: Entry) -> None:
    if entry.cwd is None:
        return
    try:
        os.fchdir(entry.cwd)
    except OSError as e:
        raise ProcessError(f"process.cwd {proc.cwd}: {e.strerror}") from None
    finally:
        os.close(entry.cwd)


def environment(proc: Process, entry: Entry) -> dict[str, str]:
    """What the process execs with: the spec's env alone (the last of a name wins), HOME as
    looked up (sandbox/exec_frontend.py sends the same to the C front end)."""
    env = dict(item.partition("=")[::2] for item in proc.env)
    env["HOME"] = entry.home
    return env


def exec_process(proc: Process, entry: Entry, pdeathsig: bool = True, seccomp=None, before_exec=None) -> None:
    """A new session, umask, cwd, HOME, no_new_privs, PDEATHSIG (credential changes cleared
    it), every signal back to its default and none blocked, then execvpe with the spec's
    environment only: nothing of ours, nothing of the caller's. Every fd of the caller's above 2
    but the preserved ones is closed already (gofer/main.py, gofer/enter.py), and ours are
    close-on-exec."""
    try:
        os.setsid()
    except OSError:
        pass  # already the leader of the session our console made
    os.umask(proc.user.umask if proc.user.umask is not None else DEFAULT_UMASK)
    _enter_cwd(proc, entry)
    env = environment(proc, entry)
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
    apply_labels(proc)
    if seccomp is not None and proc.no_new_privileges:
        seccomp.load()  # last, so it filters the container and none of our own setup
    if before_exec is not None:
        before_exec()  # the startContainer hooks: under the container's filter and no_new_privs, as under runc
    try:
        os.execvpe(proc.args[0], proc.args, env)
    except OSError as e:
        raise ExecError(f"exec {proc.args[0]}: {e.strerror}", op="exec", path=proc.args[0]) from None


def tail(proc: Process, console, personality: Personality | None, scheduling: str, seccomp=None, *,
         entry: Entry | None = None, rlimits: bool = False, ready=None, pdeathsig: bool = True,
         before_exec=None) -> None:
    """The process's last steps, the same for the container's init (gofer/main.py) and for
    exec's process (gofer/enter.py), in runc's order: the console, what the image gives it
    (cwd, HOME; looked up here unless ``entry`` was, before a fork), the rlimits if they are
    still to set, the scheduling part left (``scheduling``: set_scheduling's), the user and
    capabilities; then ``ready()`` (the init: Ready, and the wait for start), and exec.
    Never returns. sandbox/frontend.c is the same tail in C, for exec's planned process."""
    if console is not None:
        open_console(console, proc)
    if entry is None:
        entry = look_up(proc)
    if rlimits:
        set_rlimits(proc)
    set_scheduling(proc, personality, scheduling)
    become(proc, seccomp)
    if ready is not None:
        ready()
    exec_process(proc, entry, pdeathsig=pdeathsig, seccomp=seccomp, before_exec=before_exec)
