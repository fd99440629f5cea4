"""The spec's side of the root: namespaces, the rootfs mount, the spec's mounts and devices,
pivot_root, masked and read-only paths. Each step's comment says why it comes where it does.
"""

from __future__ import annotations

import errno
import os
import stat

from gofer import syscalls as sc
from gofer.root import MS, Root
from mounts.errors import BundleError, MountError, ProcessError, SandboxError
from mounts.spec import Device, Mount, Spec, sysctl_file

# mount(8) option -> (flags to set, flags to clear)
FLAGS = {
    "ro": (sc.MS_RDONLY, 0), "rw": (0, sc.MS_RDONLY),
    "nosuid": (sc.MS_NOSUID, 0), "suid": (0, sc.MS_NOSUID),
    "nodev": (sc.MS_NODEV, 0), "dev": (0, sc.MS_NODEV),
    "noexec": (sc.MS_NOEXEC, 0), "exec": (0, sc.MS_NOEXEC),
    "sync": (sc.MS_SYNCHRONOUS, 0), "async": (0, sc.MS_SYNCHRONOUS),
    "dirsync": (sc.MS_DIRSYNC, 0), "mand": (sc.MS_MANDLOCK, 0), "nomand": (0, sc.MS_MANDLOCK),
    "atime": (0, sc.MS_NOATIME), "noatime": (sc.MS_NOATIME, 0),
    "diratime": (0, sc.MS_NODIRATIME), "nodiratime": (sc.MS_NODIRATIME, 0),
    "relatime": (sc.MS_RELATIME, 0), "norelatime": (0, sc.MS_RELATIME),
    "strictatime": (sc.MS_STRICTATIME, 0), "nostrictatime": (0, sc.MS_STRICTATIME),
    "bind": (sc.MS_BIND, 0), "rbind": (sc.MS_BIND | sc.MS_REC, 0),
    "nosymfollow": (sc.MS_NOSYMFOLLOW, 0), "lazytime": (sc.MS_LAZYTIME, 0),
}
PROPAGATION = {"private": sc.MS_PRIVATE, "rprivate": sc.MS_PRIVATE | sc.MS_REC,
               "slave": sc.MS_SLAVE, "rslave": sc.MS_SLAVE | sc.MS_REC,
               "shared": sc.MS_SHARED, "rshared": sc.MS_SHARED | sc.MS_REC,
               "unbindable": sc.MS_UNBINDABLE, "runbindable": sc.MS_UNBINDABLE | sc.MS_REC}

# What runc gives every container in /dev (char devices: name, major, minor).
DEFAULT_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                   ("urandom", 1, 9), ("tty", 5, 0))
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"), ("core", "/proc/kcore"))


def parse_options(options: list[str]) -> tuple[int, int, str]:
    """(flags, propagation flags, data) for a list of mount(8) options."""
    flags = prop = 0
    data = []
    for opt in options:
        if opt in FLAGS:
            on, off = FLAGS[opt]
            flags = (flags | on) & ~off
        elif opt in PROPAGATION:
            prop |= PROPAGATION[opt]
        else:
            data.append(opt)
    return flags, prop, ",".join(data)


def namespace_flags(spec: Spec) -> tuple[int, list[tuple[str, str]]]:
    """(flags to unshare, [(type, path)] to join). The mount namespace is new unless the
    spec names one by path: a container never shares the runtime's own (mounting into the
    host's tree and chroot-ing, as runc does then, is refused by not doing it)."""
    flags = 0
    join = []
    for ns in spec.linux.namespaces:
        if ns.type not in sc.NAMESPACES:
            raise MountError(ns.type, f"linux.namespaces: unknown namespace type {ns.type!r}")
        if ns.type == "user":
            continue  # entered first, on its own (gofer/userns.py)
        if ns.path:
            join.append((ns.type, ns.path))
        else:
            flags |= sc.NAMESPACES[ns.type]
    if not any(t == "mount" for t, _ in join):
        flags |= sc.CLONE_NEWNS
    join.sort(key=lambda item: item[0] == "mount")  # last: it changes our root
    return flags, join


def prepare_root(spec: Spec, rootfs: str, overlay: bool = False, scratch_size: str | None = None,
                 in_userns: bool = False) -> Root:
    """Make our copy of the mount tree private, then the rootfs a mount point of its own.

    Propagation first: nothing we mount may leak back to the host's namespace. The rootfs
    is bound onto itself because pivot_root needs a mount point, and so that its read-only
    remount at the end touches only our copy. With ``overlay`` (a GPU container) the whole
    root then gets one private overlay, before any other mount so nothing needs moving:
    mount points and links for GPU files go to its tmpfs upper layer, and so do the
    container's own writes (as with runsc's overlay root): the image is never modified."""
    prop = PROPAGATION.get(spec.linux.rootfs_propagation or "rprivate", sc.MS_PRIVATE | sc.MS_REC)
    # private stays private; slave and shared roots start as slaves (host mounts still reach
    # them, none of ours goes back); propagate_root makes a shared one shared past pivot_root
    sc.mount(None, "/", None, sc.MS_REC | (sc.MS_PRIVATE if prop & (sc.MS_PRIVATE | sc.MS_UNBINDABLE) else sc.MS_SLAVE))
    sc.mount(rootfs, rootfs, None, sc.MS_BIND | sc.MS_REC)
    # in a user namespace our overlays belong to root there: its nobody (the image's owner,
    # as it reads in there) must not gain the image's directories
    root = Root(rootfs, scratch_size, (0, 0) if in_userns else None)
    if overlay:
        root.writable(root.fd, "/")
    return root


def _cgroup(root: Root, m: Mount, flags: int, mine: dict[str, str]) -> None:
    """cgroup v2 hosts get a fresh cgroup2 mount. v1/hybrid hosts get what runc builds: a
    tmpfs with, for each hierarchy, the container's own cgroup of it bound in (so the
    container reads its own limits at /sys/fs/cgroup/memory/memory.limit_in_bytes and sees
    nothing of the host's other cgroups). We are already in those cgroups: the supervisor
    put us there before Start."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        root.mount_fs("cgroup2", "cgroup", m.destination, flags & ~(sc.MS_BIND | sc.MS_REC), None)
        return
    tmp = root.mount_fs("tmpfs", "tmpfs", m.destination, sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC, "mode=755")
    root.mark_writable(tmp)
    for name in sorted(os.listdir("/sys/fs/cgroup")):
        host = os.path.join("/sys/fs/cgroup", name)
        key = name.split(",")[0]
        if key not in mine or os.path.islink(host) or not os.path.ismount(host):
            continue
        try:
            src = os.open(host + mine[key], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue  # not in that hierarchy's tree from here (an unusual host): leave it out
        try:
            root.bind(src, f"{m.destination}/{name}", bind_flags(flags), is_dir=True)
        finally:
            os.close(src)
    if flags & sc.MS_RDONLY:
        sc.mount(None, sc.fdpath(tmp), None, sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def bind_flags(flags: int) -> tuple[str, ...]:
    """The ro/nosuid/nodev/noexec names Root.bind takes, from mount(2) flags."""
    return tuple(name for name, bit in MS.items() if flags & bit)


# What may be bound over a file of the container's /proc (runc's list: lxcfs's files).
PROC_BINDS = ("/proc/cpuinfo", "/proc/diskstats", "/proc/meminfo", "/proc/stat", "/proc/swaps", "/proc/uptime",
              "/proc/loadavg", "/proc/slabinfo", "/proc/net/dev", "/proc/sys/kernel/ns_last_pid")


def _proc_is_procfs(m: Mount, fstype: str | None) -> None:
    """/proc is procfs and nothing else (runc's rule, CVE-2019-16884): an image's VOLUME /proc
    would put a directory of the image's in its place, where the container's labels and
    sysctls are written and its processes are looked up."""
    dest = os.path.normpath("/" + m.destination.lstrip("/"))  # (normpath keeps a leading //)
    if dest == "/proc" and fstype != "proc":
        raise MountError(m.destination, f"only procfs may be mounted on /proc (got {fstype or 'none'})")
    if dest.startswith("/proc/") and fstype != "proc" and dest not in PROC_BINDS:
        raise MountError(m.destination, f"{fstype or 'a mount'} under /proc is not allowed "
                         f"(only over {', '.join(PROC_BINDS)})")


def _not_into_proc(root: Root, m: Mount, proc_dev: int) -> None:
    """The same rule on where a destination leads, not how it reads: the image's /data ->
    /proc/sys must not put a volume over the container's procfs (runc checks the resolved
    path too)."""
    if os.path.normpath("/" + m.destination.lstrip("/")) in PROC_BINDS:
        return
    try:
        fd = root.open(m.destination)
    except OSError:
        return  # not there yet: made where it leads, which procfs refuses
    try:
        if os.fstat(fd).st_dev == proc_dev:
            raise MountError(m.destination, "leads into /proc, where only procfs and "
                             f"{', '.join(PROC_BINDS)} may be mounted")
    finally:
        os.close(fd)


def _ordinary_dir(root: Root, unsafe_path: str) -> None:
    """proc and sysfs go on a directory reached without symlinks (runc's rule): an image's
    /proc -> / would put them anywhere, and the masks meant for /proc would miss them."""
    try:
        os.close(sc.openat2(root.fd, unsafe_path.lstrip("/") or ".", os.O_PATH,
                            sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_SYMLINKS, what=unsafe_path))
    except FileNotFoundError:
        pass  # made as a directory by the mount
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MountError(unsafe_path, "must be mounted on an ordinary directory, not through a symlink") from None
        raise


def _is_bind(m: Mount) -> bool:
    flags = parse_options(m.options)[0]
    return (m.type or ("bind" if flags & sc.MS_BIND else None)) == "bind" or bool(flags & sc.MS_BIND)


def clone_bind_sources(spec: Spec, bundle: str, shared_only: bool = False) -> dict[int, int]:
    """{index in spec.mounts: detached clone} of every bind source, made now, with the
    host's privileges: from inside a user namespace the host's paths may be out of reach (a
    0700 directory of the host's root), and a mount of another namespace cannot be cloned
    there. Detached trees can be attached anywhere (runc opens its sources outside too).

    ``shared_only``: the binds with shared or rshared propagation alone (Kubernetes'
    Bidirectional), cloned before prepare_root makes our copy of the host's tree a slave:
    then a clone of a shared source is a peer of the host's mount, so a mount made under it
    in the container appears on the host and the host's in the container, as under runc.
    Everything else we mount stays out of the host's peer groups."""
    fds = {}
    try:
        for i, m in enumerate(spec.mounts):
            if _is_bind(m) and (not shared_only or parse_options(m.options)[1] & sc.MS_SHARED):
                src = _open_source(m, bundle)
                try:
                    fds[i] = sc.clone_tree(src, bool(parse_options(m.options)[0] & sc.MS_REC), what=m.destination)
                finally:
                    os.close(src)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _in_order(tree: int, flags: int) -> int:
    """A clone, made now, of the detached ``tree`` cloned earlier (clone_bind_sources), which
    it replaces: kernels from 6.8 on list mounts in the order they were made, and the spec's
    mounts must read in the spec's order (runtime-tools' mounts test), so a bind is made at
    its turn. A clone keeps the peer group (a Bidirectional bind stays one) and the locks (a
    user namespace's). Where the kernel refuses to clone a detached tree, the earlier clone
    itself (on a kernel that lists mounts as they were made, that bind then reads early)."""
    try:
        fresh = sc.clone_tree(tree, bool(flags & sc.MS_REC))
    except OSError:
        return tree
    os.close(tree)
    return fresh


def _open_source(m: Mount, bundle: str) -> int:
    source = m.source or ""
    if not os.path.isabs(source):
        source = os.path.join(bundle, source)
    try:
        return os.open(source, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(m.destination, f"bind source {source}: {e.strerror}") from None


def spec_mounts(root: Root, spec: Spec, bundle: str, sources: dict[int, int] | None,
                cgroups: dict[str, str]) -> None:
    """The spec's mounts in order (bind sources from ``sources`` where cloned already; a
    cgroup mount shows ``cgroups``: gofer.cgroups.own_cgroups() read before any cgroup
    namespace, where every path reads "/" and binding it would show the container each
    hierarchy's root, and let it move itself out of its device rules)."""
    sources = sources or {}
    proc_dev = None  # the container's procfs, once mounted
    for i, m in enumerate(spec.mounts):
        flags, prop, data = parse_options(m.options)
        fstype = m.type or ("bind" if flags & sc.MS_BIND else None)
        if fstype == "cgroup":
            _cgroup(root, m, flags, cgroups)
            continue
        if fstype in ("proc", "sysfs"):
            _ordinary_dir(root, m.destination)
        _proc_is_procfs(m, fstype)
        if proc_dev is not None:
            _not_into_proc(root, m, proc_dev)
        if _is_bind(m):
            detached = i in sources
            src = _in_order(sources.pop(i), flags) if detached else _open_source(m, bundle)
            try:
                is_dir = stat.S_ISDIR(os.fstat(src).st_mode)
                root.bind(src, m.destination, bind_flags(flags), recursive=bool(flags & sc.MS_REC), is_dir=is_dir,
                          detached=detached)
            finally:
                os.close(src)
        else:
            fd = root.mount_fs(fstype, m.source or fstype, m.destination, flags, data or None)
            if fstype == "tmpfs":
                root.mark_writable(fd)
            elif fstype == "proc":
                proc_dev = os.fstat(fd).st_dev
        if prop:
            fd = root.open(m.destination)
            try:
                sc.mount(None, sc.fdpath(fd), None, prop)
            finally:
                os.close(fd)


def make_devices(root: Root, devices: list[Device], bind: bool = False) -> None:
    """runc's default nodes and links in /dev, then linux.devices, made with mknod in the
    container's /dev (a tmpfs from the spec, or an overlay of the image's /dev). With
    ``bind`` (in a user namespace, where mknod is not allowed) the host's own nodes at the
    same paths are bound instead, as runc binds them."""
    root.not_the_root(root.ensure_dir("/dev"), "/dev")
    wanted = [("/dev/" + n, "c", ma, mi, 0o666, 0, 0) for n, ma, mi in DEFAULT_DEVICES]
    wanted += [(d.path, d.type, d.major or 0, d.minor or 0, d.file_mode & 0o7777 if d.file_mode is not None else 0o666,
                d.uid or 0, d.gid or 0) for d in devices]
    for path, kind, major, minor, mode, uid, gid in wanted:
        # Each parent looked up afresh (Root caches them): a node in a directory of the image's
        # root ("/x", or "/etc/../../x", which runc's securejoin makes /x too) overlays the
        # root, and the fds of the directories below it, /dev's too, then name hidden mounts.
        head, _, name = path.rpartition("/")
        parent = root.writable(root.ensure_dir(head or "/"), head or "/")
        fmt = {"c": stat.S_IFCHR, "u": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}.get(kind)
        if fmt is None:
            raise MountError(path, f"linux.devices: unknown device type {kind!r}")
        if bind:
            _bind_host_node(root, path, fmt, major, minor)
            continue
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        try:
            os.mknod(name, fmt | (mode & 0o7777), os.makedev(major, minor), dir_fd=parent)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise MountError(path, f"mknod {kind} {major}:{minor}: {e.strerror}") from None
    dev = root.writable(root.ensure_dir("/dev"), "/dev")
    for name, target in DEV_LINKS:
        try:
            os.symlink(target, name, dir_fd=dev)
        except FileExistsError:
            pass


def _bind_host_node(root: Root, path: str, fmt: int, major: int, minor: int) -> None:
    """The host's node at ``path`` bound in, once it shows the type and numbers asked for."""
    try:
        src = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(path, f"no such device on the host to bind into the user namespace: {e.strerror}") from None
    try:
        st = os.fstat(src)
        if stat.S_IFMT(st.st_mode) != fmt or (fmt != stat.S_IFIFO and st.st_rdev != os.makedev(major, minor)):
            raise MountError(path, f"the host's {path} is not the device {major}:{minor} asked for")
        root.bind(src, path, ("nosuid", "noexec"))
    finally:
        os.close(src)


def ensure_cwd(root: Root, cwd: str) -> None:
    """process.cwd made where the image lacks it (runc makes it too: an image's WORKDIR need
    not exist), in an overlay of its parent like any entry we add: the image stays as it is."""
    try:
        os.close(root.open(cwd, os.O_PATH | os.O_DIRECTORY))
    except OSError as e:
        if e.errno == errno.ENOENT:
            try:
                root.ensure_dir(cwd)
            except (OSError, SandboxError) as err:  # (in a procfs, say: /proc/self/fd/N of no fd)
                raise ProcessError(f"process.cwd {cwd}: cannot be made: {err}") from None
        # else not a directory, a link out: process.cwd's own error, from look_up


def pivot(root: Root) -> None:
    """pivot_root into the rootfs and drop the old root.

    pivot_root(".", ".") stacks the old root on top of the new one; unmounting it (lazily,
    it is busy) leaves the container's root alone at "/". Nothing of the host remains
    reachable afterwards."""
    os.fchdir(root.fd)
    sc.pivot_root(".", ".")
    sc.umount2(".", sc.MNT_DETACH)
    os.chdir("/")


def write_sysctls(sysctl: dict[str, str]) -> None:
    """linux.sysctl, each through our procfs (opened before any namespace: its /proc/sys/net
    is the network namespace we are in). The keys were checked to be names of namespaces of
    the container's own (mounts/bundle.py); one this kernel or namespace lacks, or a value
    it refuses, is the bundle's error."""
    for key, value in sysctl.items():
        name = "sys/" + sysctl_file(key)
        try:
            fd = sc.open_proc(name, os.O_WRONLY)
        except FileNotFoundError:
            raise BundleError(f"linux.sysctl: {key!r}: no such sysctl in the container's namespaces "
                              f"(/proc/{name})") from None
        except OSError as e:
            raise BundleError(f"linux.sysctl: {key!r}: /proc/{name}: {e.strerror}") from None
        try:
            os.write(fd, value.encode())
        except OSError as e:
            raise BundleError(f"linux.sysctl: {key!r}: the kernel refuses {value[:64]!r}: {e.strerror}") from None
        finally:
            os.close(fd)


def mask_and_protect(spec: Spec) -> None:
    """maskedPaths: /dev/null over files, an empty read-only tmpfs over directories.
    readonlyPaths: bound onto themselves read-only. Run after pivot_root, inside the root."""
    for path in spec.linux.masked_paths:
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            sc.mount("tmpfs", path, "tmpfs", sc.MS_RDONLY, "size=0,mode=0555")
        else:
            sc.mount("/dev/null", path, None, sc.MS_BIND)
    for path in spec.linux.readonly_paths:
        if not os.path.lexists(path):
            continue
        sc.mount(path, path, None, sc.MS_BIND | sc.MS_REC)
        sc.mount(None, path, None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_REC)


def propagate_root(spec: Spec) -> None:
    """linux.rootfsPropagation on the container's "/" (as runc applies it, past pivot_root).
    Until then our copy of the tree was private or slave (prepare_root), so a shared root
    is a new peer group of the container's own, never one joined with the host's mounts
    (but for the shared binds, cloned before: clone_bind_sources)."""
    prop = spec.linux.rootfs_propagation
    if prop:
        sc.mount(None, "/", None, PROPAGATION[prop])


def readonly_root(root: Root) -> None:
    """root.readonly: the root and every overlay we put on image directories go read-only
    (the bound libraries already are)."""
    sc.mount(None, "/", None, sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY)
    root.readonly_overlays()
