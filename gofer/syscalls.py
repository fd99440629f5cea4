"""The raw Linux syscalls the gofer needs: one of the two modules that import ctypes (the
other is mounts/nvml.py, NVML in a forked child).

Every call declares argtypes/restype, retries EINTR where the kernel may return it (mounts,
namespaces, opens, bpf; not capset, which never blocks), and raises ``SyscallError`` naming
the operation and the path; mount errors print their flags as names (MS_BIND|MS_RDONLY), as
runc's mount errors do. x86-64 and aarch64 syscall numbers for the calls glibc 2.36 lacks
wrappers for (openat2, pivot_root, open_tree, move_mount, fsopen, fsconfig, fsmount,
mount_setattr).
"""

from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)

# mount(2) flags
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_SYNCHRONOUS = 0x10
MS_REMOUNT = 0x20
MS_MANDLOCK = 0x40
MS_DIRSYNC = 0x80
MS_NOSYMFOLLOW = 0x100
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_SILENT = 0x8000
MS_UNBINDABLE = 1 << 17
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MS_LAZYTIME = 1 << 25
_MS_NAMES = {v: k for k, v in globals().items() if k.startswith("MS_")}

MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

# clone(2) namespace flags
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = {"mount": CLONE_NEWNS, "cgroup": CLONE_NEWCGROUP, "uts": CLONE_NEWUTS,
              "ipc": CLONE_NEWIPC, "user": CLONE_NEWUSER, "pid": CLONE_NEWPID, "network": CLONE_NEWNET}

# openat2(2)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

# new mount API
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

# close_range(2)

# netdevice(7)
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

_NR = {
    "x86_64": {"pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430,
               "fsconfig": 431, "fsmount": 432, "openat2": 437, "mount_setattr": 442, "setns": 308,
               "close_range": 436, "bpf": 321},
    "aarch64": {"pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430,
                "fsconfig": 431, "fsmount": 432, "openat2": 437, "mount_setattr": 442, "setns": 268,
                "close_range": 436, "bpf": 280},
}[os.uname().machine]

_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_mount.restype = ctypes.c_int
_umount2 = _libc.umount2
_umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_umount2.restype = ctypes.c_int
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_unshare.restype = ctypes.c_int
_setns = _libc.setns
_setns.argtypes = [ctypes.c_int, ctypes.c_int]
_setns.restype = ctypes.c_int
_madvise = _libc.madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_madvise.restype = ctypes.c_int


class SyscallError(OSError):
    """An OSError whose message names the operation and its arguments. Made for an errno
    that has one of OSError's own subclasses (ENOENT: FileNotFoundError ...), it is one of
    those too, as os.open's errors are: ``except FileNotFoundError`` catches it."""

    errno: int  # always set: __init__ passes (err, message) to OSError
    strerror: str

    def __new__(cls, err: int, op: str = "", detail: str = ""):
        if cls is SyscallError and err in _KINDS:
            cls = _KINDS[err]
        # (the arguments are OSError's from here: its __init__ takes none once __new__ did)
        return OSError.__new__(cls, err, f"{op} {detail}: {os.strerror(err)}")

    def __init__(self, err: int, op: str, detail: str):
        self.op = op

    def __str__(self) -> str:
        return self.strerror


_KINDS: dict[int, type[SyscallError]] = {
    err: type(f"Syscall{base.__name__}", (SyscallError, base), {})
    for err, base in ((errno.ENOENT, FileNotFoundError), (errno.EEXIST, FileExistsError),
                      (errno.ENOTDIR, NotADirectoryError), (errno.EISDIR, IsADirectoryError),
                      (errno.EACCES, PermissionError), (errno.EPERM, PermissionError),
                      (errno.EAGAIN, BlockingIOError), (errno.EINTR, InterruptedError))}


def mount_flags_str(flags: int) -> str:
    names = [name for bit, name in sorted(_MS_NAMES.items()) if flags & bit]
    return "|".join(names) or "0"


def _check(res: int, op: str, detail: str) -> int:
    if res < 0:
        raise SyscallError(ctypes.get_errno(), op, detail)
    return res


def _retry(fn, *args):
    while True:
        res = fn(*args)
        if res >= 0 or ctypes.get_errno() != errno.EINTR:
            return res


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


# inotify(7): what changes a directory's entries or a file in it (never a read)
IN_CHANGES = (0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800)  # IN_MODIFY ATTRIB CLOSE_WRITE
# MOVED_FROM MOVED_TO CREATE DELETE DELETE_SELF MOVE_SELF


def inotify_init() -> int:
    """A non-blocking inotify fd: it reads an event once anything a watch of it names changed."""
    return _check(_libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1", "")


def inotify_add(fd: int, path: str) -> None:
    """Watch ``path`` (a directory: its entries too) for IN_CHANGES."""
    _check(_libc.inotify_add_watch(fd, _b(path), IN_CHANGES), "inotify_add_watch", path)


MADV_POPULATE_WRITE = 23  # (5.14) fault pages in writable, as a write would: a copy-on-write page is copied


def madvise(addr: int, length: int, advice: int) -> None:
    _check(_madvise(addr, length, advice), "madvise", f"{addr:#x}+{length:#x}")


def buffer_address(buf) -> int:
    """Where a writable buffer's (an mmap's) first byte is."""
    view = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # (the buffer may be closed again)


def fdpath(fd: int) -> str:
    """The magic link through which mount(2) reaches what ``fd`` refers to."""
    return f"/proc/self/fd/{fd}"


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    res = _retry(_mount, _b(source), _b(target), _b(fstype), flags, _b(data))
    _check(res, "mount", f"{source or 'none'} on {target} (type {fstype or 'none'}, "
                         f"flags {mount_flags_str(flags)}{', data ' + data if data else ''})")


def umount2(target: str, flags: int = 0) -> None:
    _check(_retry(_umount2, _b(target), flags), "umount2", target)


def unshare(flags: int) -> None:
    _check(_retry(_unshare, flags), "unshare", hex(flags))


def setns(fd: int, nstype: int = 0, what: str = "") -> None:
    _check(_retry(_setns, fd, nstype), "setns", what or str(fd))


def pivot_root(new_root: str, put_old: str) -> None:
    res = _retry(_syscall, ctypes.c_long(_NR["pivot_root"]), _b(new_root), _b(put_old))
    _check(res, "pivot_root", f"{new_root} {put_old}")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


OPENAT2_AVAILABLE = True


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0, what: str = "") -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    res = _retry(_syscall, ctypes.c_long(_NR["openat2"]), ctypes.c_int(dirfd), _b(path),
                 ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    return _check(res, "openat2", what or path)


# The host's procfs, opened while it is the one at /proc: past pivot_root or setns, /proc is
# whatever the container's root has there (no procfs at all, or a directory of the image's
# with a symlink at self/fd/N leading to a FIFO), so our own uses of /proc go through this.
PROC = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


PROC_SUPER_MAGIC = 0x9FA0
_fstatfs = _libc.fstatfs
_fstatfs.argtypes, _fstatfs.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_int


def _fstatfs_type(fd: int) -> int:
    """statfs's f_type of ``fd`` (the first field, a long), -1 on error."""
    buf = (ctypes.c_long * 16)()  # struct statfs is 120 bytes on 64-bit Linux
    if _retry(_fstatfs, fd, buf) != 0:
        return -1
    return buf[0]


def open_proc(rel: str, flags: int) -> int:
    """``rel`` under our procfs (self/, thread-self/, sys/: ours, our namespaces')."""
    if PROC < 0:
        raise OSError(errno.ENOENT, "no procfs of the container's at /proc", rel)
    return os.open(rel, flags | os.O_CLOEXEC, dir_fd=PROC)


def leave_host_proc() -> None:
    """Close the host's procfs before a process of ours becomes visible in a container's pid
    namespace (exec's child, the init before it reports ready): a container process with
    CAP_SYS_PTRACE reads our fds past the non-dumpable flag, and /proc/<pid>/fd/N leading
    to the host's procfs leads on to /proc/1/root, the host's root. Our root is the
    container's by now: its /proc, if it is a procfs (only a real one has the magic; it
    shows the container's pid namespace), serves what is left (reopening a file by fd, the
    LSM labels); without one those fail as "no procfs"."""
    global PROC
    old, PROC = PROC, -1
    os.close(old)
    try:
        fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    if _fstatfs_type(fd) == PROC_SUPER_MAGIC:
        PROC = fd
    else:
        os.close(fd)


def open_regular(path_fd: int) -> int | None:
    """A readable fd of what the O_PATH fd ``path_fd`` refers to, if it is a regular file;
    None for anything else. The check comes before any real open: opening an image's FIFO
    or device node (a watchdog, a tape) as the host's root can hang or have effects."""
    import stat

    if not stat.S_ISREG(os.fstat(path_fd).st_mode):
        return None
    return open_proc(f"self/fd/{path_fd}", os.O_RDONLY)  # the same file, not a path


def open_tree(dirfd: int, path: str, flags: int, what: str = "") -> int:
    res = _retry(_syscall, ctypes.c_long(_NR["open_tree"]), ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags))
    return _check(res, "open_tree", what or path)


def clone_tree(fd: int, recursive: bool, what: str = "") -> int:
    """A detached clone of the mount ``fd`` refers to (its submounts too where ``recursive``)."""
    return open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0), what)


def move_mount(from_fd: int, to_fd: int, what: str = "") -> None:
    """Attach the mount ``from_fd`` (a detached tree, or one to move) onto ``to_fd``."""
    res = _retry(_syscall, ctypes.c_long(_NR["move_mount"]), ctypes.c_int(from_fd), b"",
                 ctypes.c_int(to_fd), b"", ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))
    _check(res, "move_mount", what)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr(fd: int, attr_set: int, recursive: bool = False, what: str = "") -> None:
    attr = _MountAttr(attr_set, 0, 0, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    res = _retry(_syscall, ctypes.c_long(_NR["mount_setattr"]), ctypes.c_int(fd), b"", ctypes.c_uint(flags),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(res, "mount_setattr", what)


def fsmount(fstype: str, options: dict[str, str] | None = None) -> int:
    """A new, detached mount of ``fstype``: an fd to its root, reachable only through it
    until move_mount() attaches it somewhere."""
    nr = _NR["fsconfig"]
    fs = _check(_retry(_syscall, ctypes.c_long(_NR["fsopen"]), _b(fstype), ctypes.c_uint(FSOPEN_CLOEXEC)),
                "fsopen", fstype)
    try:
        for key, value in (options or {}).items():
            res = _retry(_syscall, ctypes.c_long(nr), ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_SET_STRING),
                         _b(key), _b(value), ctypes.c_int(0))
            _check(res, "fsconfig", f"{fstype} {key}={value}")
        res = _retry(_syscall, ctypes.c_long(nr), ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_CMD_CREATE),
                     None, None, ctypes.c_int(0))
        _check(res, "fsconfig", f"{fstype} create ({', '.join(f'{k}={v}' for k, v in (options or {}).items())})")
        res = _retry(_syscall, ctypes.c_long(_NR["fsmount"]), ctypes.c_int(fs), ctypes.c_uint(FSMOUNT_CLOEXEC),
                     ctypes.c_uint(0))
        return _check(res, "fsmount", fstype)
    finally:
        os.close(fs)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_capset = _libc.capset
_capset.argtypes = [ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData * 2)]
_capset.restype = ctypes.c_int
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def capset(effective: set[int], permitted: set[int], inheritable: set[int]) -> None:
    """Set the three capability sets of this thread in one capset(2) call."""
    data = (_CapData * 2)()
    for word in (0, 1):
        def bits(caps: set[int], word: int = word) -> int:
            return sum(1 << (c - 32 * word) for c in caps if 32 * word <= c < 32 * (word + 1))
        data[word] = _CapData(bits(effective), bits(permitted), bits(inheritable))
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _check(_capset(ctypes.byref(header), ctypes.byref(data)), "capset",
           f"effective={sorted(effective)} permitted={sorted(permitted)} inheritable={sorted(inheritable)}")


def close_fds(first: int, keep: set[int]) -> None:
    """Close every fd from ``first`` up but those in ``keep``: close_range(2) over the gaps
    (Linux 5.9), each fd /proc/self/fd lists on older kernels. Closed, not marked
    close-on-exec: a process that waits in a container's namespaces (a created init, exec's
    child) must hold nothing of its caller's that a ptracer in there could take (pidfd_getfd).
    Below ``first``, among the preserved fds, ours are closed too: they are close-on-exec, a
    preserved one (inherited across the caller's exec) is not."""
    import fcntl

    for fd in range(3, min(first, 1024)):  # ours in a gap of the preserved ones: close-on-exec, theirs are not
        try:
            if fd not in keep and fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                os.close(fd)
        except OSError:
            pass  # (no such fd)
    low = first
    for fd in sorted(k for k in keep if k >= first) + [0xFFFFFFFF + 1]:
        if fd > low and _retry(_syscall, ctypes.c_long(_NR["close_range"]), ctypes.c_uint(low),
                               ctypes.c_uint(fd - 1), ctypes.c_uint(0)) != 0:
            break
        low = fd + 1
    else:
        return
    for name in os.listdir("/proc/self/fd"):
        if int(name) >= first and int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the fd listdir itself used, closed by now


def loopback_up() -> None:
    """Bring ``lo`` up in our (new) network namespace, as runc does for a new one."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


# --- bpf(2): cgroup v2 device programs (gofer/devfilter.py writes them) --------------------

BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4


def _bpf(cmd: int, attr: bytes, what: str) -> tuple[int, ctypes.Array]:
    buf = ctypes.create_string_buffer(attr, len(attr))
    res = _retry(_syscall, ctypes.c_long(_NR["bpf"]), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr)))
    return _check(res, "bpf", what), buf


def bpf_prog_load_device(insns: bytes, what: str) -> int:
    """Load a BPF_PROG_TYPE_CGROUP_DEVICE program; returns its fd (close-on-exec). The
    verifier's log is asked for only after a refusal, to say why."""
    import struct

    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"Apache")
    def attr(log: ctypes.Array | None) -> bytes:
        return struct.pack("<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_DEVICE, len(insns) // 8,
                           ctypes.addressof(code), ctypes.addressof(lic), 1 if log else 0,
                           len(log) if log else 0, ctypes.addressof(log) if log else 0, 0, 0,
                           b"sandbox_devices", 0, BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr(None), what)[0]
    except SyscallError as e:
        log = ctypes.create_string_buffer(1 << 16)
        try:
            _bpf(BPF_PROG_LOAD, attr(log), what)
        except SyscallError:
            pass
        reason = log.value.decode(errors="replace").strip().splitlines()
        raise SyscallError(e.errno, "bpf", f"{what} (BPF_PROG_LOAD{': ' + reason[-1] if reason else ''})") from None


def bpf_prog_attach(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int = 0, what: str = "") -> None:
    import struct

    _bpf(BPF_PROG_ATTACH, struct.pack("<IIIII", cgroup_fd, prog_fd, BPF_CGROUP_DEVICE, flags, replace_fd),
         f"{what} (BPF_PROG_ATTACH)")


def bpf_prog_detach(cgroup_fd: int, prog_fd: int, what: str = "") -> None:
    import struct

    _bpf(BPF_PROG_DETACH, struct.pack("<III", cgroup_fd, prog_fd, BPF_CGROUP_DEVICE), f"{what} (BPF_PROG_DETACH)")


def bpf_prog_query(cgroup_fd: int, what: str = "") -> tuple[int, list[int]]:
    """(attach flags, ids) of the device programs attached to the cgroup itself."""
    import struct

    ids = (ctypes.c_uint32 * 64)()
    _, buf = _bpf(BPF_PROG_QUERY, struct.pack("<IIIIQI4x", cgroup_fd, BPF_CGROUP_DEVICE, 0, 0,
                                              ctypes.addressof(ids), len(ids)), f"{what} (BPF_PROG_QUERY)")
    flags, count = struct.unpack_from("<I", buf, 12)[0], struct.unpack_from("<I", buf, 24)[0]
    return flags, list(ids[:count])


def bpf_prog_get_fd(prog_id: int, what: str = "") -> int:
    import struct

    return _bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("<III", prog_id, 0, 0), f"{what} (BPF_PROG_GET_FD_BY_ID)")[0]


def bpf_prog_instructions(prog_id: int, what: str = "") -> tuple[int, bytes]:
    """(an fd of program ``prog_id``, its instructions as the kernel holds them)."""
    import struct

    fd = bpf_prog_get_fd(prog_id, what)
    try:
        info = ctypes.create_string_buffer(256)
        _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)),
             f"{what} (BPF_OBJ_GET_INFO_BY_FD)")
        size = struct.unpack_from("<I", info, 20)[0]
        insns = ctypes.create_string_buffer(size)
        info = ctypes.create_string_buffer(256)
        struct.pack_into("<I", info, 20, size)  # xlated_prog_len, then xlated_prog_insns
        struct.pack_into("<Q", info, 32, ctypes.addressof(insns))
        _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)),
             f"{what} (BPF_OBJ_GET_INFO_BY_FD)")
    except BaseException:
        os.close(fd)
        raise
    return fd, insns.raw


# --- libseccomp (Debian's libseccomp2, as runc links it) -----------------------------------


def seccomp_version() -> str | None:
    """libseccomp's version (as runc's --version prints it), None where it is not installed."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return None
    fn = lib.seccomp_version
    fn.argtypes, fn.restype = [], ctypes.POINTER(ctypes.c_uint * 3)
    major, minor, micro = fn().contents
    return f"{major}.{minor}.{micro}"


SCMP_FLTATR_CTL_NNP = 3
SCMP_FLTATR_CTL_TSYNC = 4
SCMP_FLTATR_CTL_LOG = 6
SCMP_FLTATR_CTL_SSB = 7
SCMP_ACT = {"SCMP_ACT_KILL": 0x00000000, "SCMP_ACT_KILL_THREAD": 0x00000000, "SCMP_ACT_KILL_PROCESS": 0x80000000,
            "SCMP_ACT_TRAP": 0x00030000, "SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000,
            "SCMP_ACT_ALLOW": 0x7FFF0000, "SCMP_ACT_LOG": 0x7FFC0000, "SCMP_ACT_NOTIFY": 0x7FC00000}
SCMP_CMP = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
            "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
NR_SCMP_ERROR = -1


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Seccomp:
    """One libseccomp filter context. The library is loaded (dlopen) when the first filter
    is built: that must happen before pivot_root, while the host's libraries are visible."""

    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            try:
                lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
            except OSError as e:
                raise SyscallError(errno.ENOENT, "dlopen", f"libseccomp.so.2 ({e}): install libseccomp2") from None
            lib.seccomp_init.argtypes, lib.seccomp_init.restype = [ctypes.c_uint32], ctypes.c_void_p
            lib.seccomp_release.argtypes, lib.seccomp_release.restype = [ctypes.c_void_p], None
            lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
            lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
            lib.seccomp_arch_add.argtypes, lib.seccomp_arch_add.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.c_int
            lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
            lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
            lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                                   ctypes.POINTER(ScmpArgCmp)]
            lib.seccomp_rule_add_array.restype = ctypes.c_int
            lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
            lib.seccomp_attr_set.restype = ctypes.c_int
            lib.seccomp_export_bpf.argtypes, lib.seccomp_export_bpf.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
            cls._lib = lib
        return cls._lib

    def __init__(self, default_action: int):
        self._l = self.lib()
        self.ctx = self._l.seccomp_init(default_action)
        if not self.ctx:
            raise SyscallError(errno.EINVAL, "seccomp_init", hex(default_action))

    @staticmethod
    def _check(res: int, op: str, detail: str) -> int:
        if res < 0:  # libseccomp returns -errno
            raise SyscallError(-res, op, detail)
        return res

    def add_arch(self, name: str) -> bool:
        """Add an architecture by libseccomp's name (x86_64, x86, x32, aarch64 ...); False
        if libseccomp does not know it."""
        token = self._l.seccomp_arch_resolve_name(name.encode())
        if token == 0:
            return False
        res = self._l.seccomp_arch_add(self.ctx, token)
        if res < 0 and -res != errno.EEXIST:
            self._check(res, "seccomp_arch_add", name)
        return True

    def syscall(self, name: str) -> int | None:
        nr = self._l.seccomp_syscall_resolve_name(name.encode())
        return None if nr == NR_SCMP_ERROR else nr

    def add_rule(self, action: int, nr: int, args: list[tuple[int, int, int, int]], what: str) -> None:
        arr = (ScmpArgCmp * max(len(args), 1))(*[ScmpArgCmp(*a) for a in args])
        self._check(self._l.seccomp_rule_add_array(self.ctx, action, nr, len(args), arr), "seccomp_rule_add", what)

    def set_attr(self, attr: int, value: int) -> None:
        self._check(self._l.seccomp_attr_set(self.ctx, attr, value), "seccomp_attr_set", str(attr))

    def export_bpf(self) -> bytes:
        """The filter as the kernel takes it (struct sock_filter[]), for a process that loads
        it itself (the exec front end, sandbox/executor/frontend.c)."""
        fd = os.memfd_create("seccomp-export", os.MFD_CLOEXEC)
        try:
            self._check(self._l.seccomp_export_bpf(self.ctx, fd), "seccomp_export_bpf", "the container's filter")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
