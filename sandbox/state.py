"""The state directory (``--root``, runc's layout): one directory per container id holding
``state.json`` and, between create and start, the ``exec.fifo`` its init waits on.

Liveness is the init's pid *and* its start time (field 22 of /proc/PID/stat), recorded at
create: a recycled pid is never taken for the container. The status is derived, never
stored: ``creating`` until the init is ready (while the process that creates it lives: its
pid and start time are recorded until then), ``created`` while the FIFO exists, ``running``
after start, ``stopped`` once the init is gone (or a zombie nobody reaped yet), or the create
died. Until the init is known nothing is the container's: kill and delete refuse a container
being created (runc: it does not exist until create has written its state) and signal
nothing for one whose create died.

Every verb imports this module, and engines run start, state, kill and delete once per
container: it imports nothing but os, time and the `_json` accelerator (sandbox/jsonlite.py).
"""

from __future__ import annotations

import errno
import os
import time

from mounts import OCI_VERSION
from mounts.errors import SandboxError
from mounts.proc import start_time
from sandbox import jsonlite

FIFO = "exec.fifo"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")


class State:
    """What state.json holds; ``status`` is derived when it is loaded."""

    FIELDS = ("id", "pid", "bundle", "rootfs", "created", "owner", "annotations", "start_time", "creating",
              "foreground", "poststart", "poststop", "cgroup", "cgroup_created", "pid_ns", "pid_ns_own",
              "systemd_unit", "systemd_invocation")

    def __init__(self, id: str, pid: int, bundle: str, rootfs: str = "", created: str = "", owner: str = "",
                 annotations: dict | None = None, start_time: int = 0, creating: bool = False,
                 foreground: bool = False, poststart: list | None = None, poststop: list | None = None,
                 cgroup: list | None = None, cgroup_created: list | None = None, pid_ns: int = 0,
                 pid_ns_own: bool = False, systemd_unit: str = "", systemd_invocation: str = ""):
        self.id, self.pid, self.bundle, self.rootfs, self.created, self.owner = id, pid, bundle, rootfs, created, owner
        self.annotations = annotations or {}
        self.start_time = start_time  # clock ticks after boot, /proc/PID/stat field 22
        # the init has not reported ready yet: pid and start_time are then the creating
        # process's (create's or run's own), and nothing is known to be the container's
        self.creating = creating
        self.foreground = foreground  # kept by `sandbox run BUNDLE`, removed when it ends
        self.poststart = poststart or []  # the bundle's hooks (as in config.json), for start
        self.poststop = poststop or []  # ... and for delete
        self.cgroup = cgroup or []  # the container's cgroup directories (one per controller)
        self.cgroup_created = cgroup_created or []  # those we made: delete removes them
        self.pid_ns = pid_ns  # the init's pid namespace (inode; 0: not known)
        self.pid_ns_own = pid_ns_own  # made for it: every process in it is the container's
        self.systemd_unit = systemd_unit  # --systemd-cgroup: the scope unit, stopped at delete ...
        self.systemd_invocation = systemd_invocation  # ... if it is still this start of it (its InvocationID)
        self.status = "creating"

    def to_json(self) -> str:
        return jsonlite.dumps({f: getattr(self, f) for f in self.FIELDS})

    def public(self) -> dict:
        """The OCI state (plus runc's rootfs, created, owner) as `sandbox state` prints it."""
        out = {"ociVersion": OCI_VERSION, "id": self.id,
               "pid": self.pid if self.status not in ("stopped", "creating") else 0,
               "status": self.status, "bundle": self.bundle, "rootfs": self.rootfs, "created": self.created,
               "owner": self.owner}
        if self.annotations:
            out["annotations"] = self.annotations
        return out

    def hooks(self, stage: str) -> list:
        """The poststart or poststop hooks, as mounts.spec.Hook (imports msgspec: only when
        there are any)."""
        raw = getattr(self, stage)
        if not raw:
            return []
        import msgspec

        from mounts.spec import Hook

        return msgspec.convert(raw, list[Hook])


def not_found(cid: str, root: str) -> SandboxError:
    """An id with no container, in runc's words ("container does not exist"), which engines
    match: containerd's shim takes an error saying "does not exist", "container not running"
    or "no such process" for a container gone already, and stops or removes the pod."""
    return SandboxError(f"container does not exist: {cid!r} (under {root})")


def being_created(state: State, root: str) -> SandboxError:
    """kill or delete of a container whose init is not known yet (runc: no such container)."""
    return SandboxError(f"container does not exist yet: {state.id!r} is being created (under {root})")


def not_running(state: State) -> SandboxError:
    """A signal for a container whose init has exited, in runc's words (see not_found)."""
    return SandboxError(f"container not running: {state.id!r} has stopped")


def valid_id(cid: str) -> bool:
    """At most 200 of letters, digits and _.+- (a file name, a cgroup name with room to
    spare under NAME_MAX), not starting with one of the punctuation."""
    return 0 < len(cid) <= 200 and cid[0] not in "._+-" and set(cid) <= _ID_CHARS


class StateDir:
    """One container's directory under ``--root``, reached only through fds: the root is
    opened, the id's entry beneath it without following a link (a symlinked ROOT/ID is no
    state directory: never read or cleared, only removed itself), and every file inside by
    name relative to that (temp files under unpredictable names, made exclusively)."""

    def __init__(self, root: str, cid: str):
        if not valid_id(cid):
            raise SandboxError(f"container id {cid!r} is invalid (letters, digits, _.+- only)")
        self.root = root
        self.dir = os.path.join(root, cid)
        self.id = cid

    @property
    def fifo(self) -> str:
        return os.path.join(self.dir, FIFO)

    def _root_fd(self, create: bool = False) -> int | None:
        """--root, opened (made first if ``create``); None if there is none."""
        try:
            if create:
                os.makedirs(self.root, mode=0o711, exist_ok=True)
            return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except (NotADirectoryError, FileExistsError):
            raise SandboxError(f"--root {self.root}: not a directory") from None
        except OSError as e:
            raise SandboxError(f"--root {self.root}: {e.strerror}") from None

    def open_dir(self) -> int | None:
        """The container's directory (an fd to close), None if there is none; a link or a
        file in its place is an error naming it."""
        root = self._root_fd()
        if root is None:
            return None
        try:
            return os.open(self.id, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except FileNotFoundError:
            return None
        except (NotADirectoryError, OSError) as e:
            if isinstance(e, NotADirectoryError) or e.errno == errno.ELOOP:
                raise SandboxError(f"{self.dir}: not a state directory (a link or a file is in its place)") from None
            raise SandboxError(f"{self.dir}: {e.strerror}") from None
        finally:
            os.close(root)

    def is_link(self) -> bool:
        """Whether ROOT/ID is a symlink (or another non-directory) instead of our directory."""
        try:
            st = os.lstat(self.dir)
        except OSError:
            return False
        return not (st.st_mode & 0o170000 == 0o040000)

    def create(self, state: State, fifo: bool = False) -> None:
        """Claim the id: the directory is made under a private name with its state.json (and
        exec.fifo) inside, then renamed into place; rename(2) onto a directory that is not
        empty fails, so of two creates of one id exactly one wins, and a directory under the
        id always has its state. A foreground run whose init is gone is replaced (the cgroups
        it made removed with it); anything else is "already exists", as runc says."""
        root = self._root_fd(create=True)
        assert root is not None
        tmp = f".{self.id}.{os.urandom(8).hex()}.tmp"
        try:
            os.mkdir(tmp, 0o711, dir_fd=root)
            try:
                d = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
                try:
                    if fifo:  # root's alone, whatever the umask: a write into it starts the container
                        os.mkfifo(FIFO, 0o600, dir_fd=d)
                        os.chmod(FIFO, 0o600, dir_fd=d, follow_symlinks=False)
                    self._write_json(d, state)
                finally:
                    os.close(d)
                for _ in range(2):
                    try:
                        os.rename(tmp, self.id, src_dir_fd=root, dst_dir_fd=root)
                        return
                    except OSError as e:
                        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                            raise
                    old = self._read()
                    if old is None or not (old.foreground and old.status == "stopped"):
                        raise SandboxError(f"container {self.id!r} already exists ({self.dir})")
                    try:  # (its cgroups go with it, as delete removes them: else nothing would)
                        remove_cgroups(old)
                    except (OSError, SandboxError):
                        pass
                    self.remove()
                raise SandboxError(f"container {self.id!r} already exists ({self.dir})")
            except BaseException:
                self._clear(root, tmp)
                raise
        except OSError as e:
            raise SandboxError(f"--root {self.root}: cannot create the state directory {self.dir}: "
                               f"{e.strerror}") from None
        finally:
            os.close(root)

    def write(self, state: State) -> None:
        d = self.open_dir()
        if d is None:
            raise SandboxError(f"container {self.id!r}: its state directory {self.dir} is gone")
        try:
            self._write_json(d, state)
        finally:
            os.close(d)

    @staticmethod
    def _write_json(d: int, state: State) -> None:
        """state.json in the directory ``d``, replaced whole (mounts/atomic.py)."""
        from mounts.atomic import replace_whole

        replace_whole("state.json", state.to_json().encode(), 0o600, dir_fd=d)

    def open(self, name: str, flags: int) -> int:
        """A file of ours in the directory (never through a link)."""
        d = self.open_dir()
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no state directory", self.dir)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
        finally:
            os.close(d)

    def unlink(self, name: str) -> None:
        d = self.open_dir()
        if d is not None:
            try:
                _unlink(d, name)
            finally:
                os.close(d)

    def load(self) -> State:
        """The recorded state with its status derived; an error naming the id if none."""
        state = self._read()
        if state is None:
            raise not_found(self.id, self.root)
        return state

    def _read(self) -> State | None:
        """The recorded state with its status derived, both through one fd of the directory;
        None where there is none (or a create died before writing it)."""
        d = self.open_dir()
        if d is None:
            return None
        try:
            try:
                fd = os.open("state.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                with os.fdopen(fd) as f:
                    data = jsonlite.loads(f.read())
                state = State(**{k: data[k] for k in State.FIELDS if k in data})
            except (OSError, ValueError, TypeError):
                return None
            if state.pid <= 0 or start_time(state.pid) != state.start_time:
                state.status = "stopped"
            elif state.creating:
                state.status = "creating"
            else:
                state.status = "created" if _exists(d, FIFO) else "running"
            return state
        finally:
            os.close(d)

    def remove(self) -> None:
        """The directory and what we keep in it; a link in its place is removed itself (as
        runc removes it), never what it leads to."""
        root = self._root_fd()
        if root is None:
            return
        try:
            if self.is_link():
                _unlink(root, self.id)
            else:
                self._clear(root, self.id)
        finally:
            os.close(root)

    @staticmethod
    def _clear(root: int, name: str) -> None:
        """``name`` under ``root`` and what we keep in it (state.json and its temp files,
        exec.fifo), reached without following links."""
        try:
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except OSError:
            return
        try:
            for entry in os.listdir(d):
                if entry in ("state.json", FIFO) or entry.startswith("state.json."):
                    _unlink(d, entry)
        finally:
            os.close(d)
        try:
            os.rmdir(name, dir_fd=root)
        except FileNotFoundError:
            pass


def _unlink(d: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=d)
    except FileNotFoundError:
        pass


def _exists(d: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=d, follow_symlinks=False)
        return True
    except OSError:
        return False


def new_state(cid: str, pid: int, bundle: str, rootfs: str = "", annotations: dict | None = None,
              creating: bool = True, foreground: bool = False, hooks=None, cgroup=None,
              pid_ns_own: bool = False) -> State:
    """``hooks``: the bundle's mounts.spec.Hooks we run (poststart and poststop are kept)."""
    now = time.time_ns()
    created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
    kept = {}
    if hooks is not None and (hooks.poststart or hooks.poststop):
        import msgspec

        kept = {stage: msgspec.to_builtins(getattr(hooks, stage)) for stage in ("poststart", "poststop")}
    if cgroup is not None:
        kept.update(cgroup=list(dict.fromkeys(cgroup.dirs.values())), cgroup_created=list(cgroup.created),
                    systemd_unit=getattr(cgroup, "unit", ""), systemd_invocation=getattr(cgroup, "invocation", ""))
    try:
        pid_ns = os.stat(f"/proc/{pid}/ns/pid").st_ino if not creating else 0
    except OSError:
        pid_ns = 0
    return State(cid, pid, bundle, rootfs, created, "", dict(annotations or {}), start_time(pid) or 0,
                 creating, foreground, pid_ns=pid_ns, pid_ns_own=pid_ns_own, **kept)


def list_states(root: str) -> list[State]:
    """Every container recorded under ``root``, by id, with its status."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise SandboxError(f"--root {root}: not a directory") from None
    out = []
    for name in names:
        if valid_id(name):
            sd = StateDir(root, name)
            try:
                st = sd._read()
            except SandboxError:  # a link or a file in a container's place: not one
                continue
            if st is not None:
                out.append(st)
    return out


def remove_cgroups(state) -> None:
    """The container's systemd unit stopped (the one we started: a unit of that name started
    since is someone else's), the cgroups it made removed."""
    if state.systemd_unit and state.systemd_invocation:
        from gofer.systemd import stop

        stop(state.systemd_unit, state.systemd_invocation)
    if state.cgroup_created:
        from gofer.cgroups import remove_dirs

        remove_dirs(state.cgroup_created)
