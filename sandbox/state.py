"""The state directory (``--root``, runc's layout): one directory per container id holding
``state.json`` and, between create and start, the ``exec.fifo`` its init waits on.

Liveness is the init's pid *and* its start time (field 22 of /proc/PID/stat), recorded at
create: a recycled pid is never taken for the container. The status is derived, never
stored: ``creating`` until the init is ready, ``created`` while the FIFO exists, ``running``
after start, ``stopped`` once the init is gone (or a zombie nobody reaped yet).

Every verb imports this module, and engines run start, state, kill and delete once per
container: it imports nothing but os, time and the `_json` accelerator (sandbox/jsonlite.py).
"""

from __future__ import annotations

import errno
import os
import time

from mounts.errors import SandboxError
from sandbox import jsonlite

FIFO = "exec.fifo"
OCI_VERSION = "1.0.2"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")


class State:
    """What state.json holds; ``status`` is derived when it is loaded."""

    FIELDS = ("id", "pid", "bundle", "rootfs", "created", "owner", "annotations", "start_time", "creating",
              "foreground", "poststart", "poststop", "cgroup", "cgroup_created", "pid_ns", "pid_ns_own")

    def __init__(self, id: str, pid: int, bundle: str, rootfs: str = "", created: str = "", owner: str = "",
                 annotations: dict | None = None, start_time: int = 0, creating: bool = False,
                 foreground: bool = False, poststart: list | None = None, poststop: list | None = None,
                 cgroup: list | None = None, cgroup_created: list | None = None, pid_ns: int = 0,
                 pid_ns_own: bool = False):
        self.id, self.pid, self.bundle, self.rootfs, self.created, self.owner = id, pid, bundle, rootfs, created, owner
        self.annotations = annotations or {}
        self.start_time = start_time  # clock ticks after boot, /proc/PID/stat field 22
        self.creating = creating  # the init has not reported ready yet
        self.foreground = foreground  # kept by `sandbox run BUNDLE`, removed when it ends
        self.poststart = poststart or []  # the bundle's hooks (as in config.json), for start
        self.poststop = poststop or []  # ... and for delete
        self.cgroup = cgroup or []  # the container's cgroup directories (one per controller)
        self.cgroup_created = cgroup_created or []  # those we made: delete removes them
        self.pid_ns = pid_ns  # the init's pid namespace (inode; 0: not known)
        self.pid_ns_own = pid_ns_own  # made for it: every process in it is the container's
        self.status = "creating"

    def to_json(self) -> str:
        return jsonlite.dumps({f: getattr(self, f) for f in self.FIELDS})

    def public(self) -> dict:
        """The OCI state (plus runc's rootfs, created, owner) as `sandbox state` prints it."""
        out = {"ociVersion": OCI_VERSION, "id": self.id, "pid": self.pid if self.status != "stopped" else 0,
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


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None when there is no such (live) process. A zombie
    counts as gone: it will never run again."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # after "pid (comm) "
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def valid_id(cid: str) -> bool:
    """At most 200 of letters, digits and _.+- (a file name, a cgroup name with room to
    spare under NAME_MAX), not starting with one of the punctuation."""
    return 0 < len(cid) <= 200 and cid[0] not in "._+-" and set(cid) <= _ID_CHARS


class StateDir:
    def __init__(self, root: str, cid: str):
        if not valid_id(cid):
            raise SandboxError(f"container id {cid!r} is invalid (letters, digits, _.+- only)")
        self.root = root
        self.dir = os.path.join(root, cid)
        self.id = cid

    @property
    def fifo(self) -> str:
        return os.path.join(self.dir, FIFO)

    def create(self, state: State, fifo: bool = False) -> None:
        """Claim the id: the directory is made under a private name with its state.json (and
        exec.fifo) inside, then renamed into place; rename(2) onto a directory that is not
        empty fails, so of two creates of one id exactly one wins, and a directory under the
        id always has its state. A foreground run whose init is gone is replaced; anything
        else is "already exists", as runc says."""
        tmp = os.path.join(self.root, f".{self.id}.{os.getpid()}.tmp")
        try:
            os.makedirs(self.root, mode=0o711, exist_ok=True)
            os.mkdir(tmp, 0o711)
            try:
                if fifo:  # root's alone, whatever the umask: a write into it starts the container
                    os.mkfifo(os.path.join(tmp, FIFO), 0o600)
                    os.chmod(os.path.join(tmp, FIFO), 0o600)
                self._write_json(os.path.join(tmp, "state.json"), state)
                for _ in range(2):
                    try:
                        os.rename(tmp, self.dir)
                        return
                    except OSError as e:
                        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                            raise
                    old = self._read()
                    if old is None or not (old.foreground and self.status(old) == "stopped"):
                        raise SandboxError(f"container {self.id!r} already exists ({self.dir})")
                    self.remove()
                raise SandboxError(f"container {self.id!r} already exists ({self.dir})")
            except BaseException:
                StateDir._clear(tmp)
                raise
        except OSError as e:
            raise SandboxError(f"--root {self.root}: cannot create the state directory {self.dir}: "
                               f"{e.strerror}") from None

    def write(self, state: State) -> None:
        tmp = os.path.join(self.dir, "state.json.tmp")
        self._write_json(tmp, state)
        os.replace(tmp, os.path.join(self.dir, "state.json"))

    @staticmethod
    def _write_json(path: str, state: State) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(state.to_json())

    def load(self) -> State:
        """The recorded state with its status derived; an error naming the id if none."""
        state = self._read()
        if state is None:
            raise SandboxError(f"container {self.id!r} does not exist (under {self.root})")
        state.status = self.status(state)
        return state

    def _read(self) -> State | None:
        try:
            with open(os.path.join(self.dir, "state.json")) as f:
                data = jsonlite.loads(f.read())
            return State(**{k: data[k] for k in State.FIELDS if k in data})
        except (OSError, ValueError, TypeError):
            return None

    def status(self, state: State) -> str:
        if state.pid <= 0 or start_time(state.pid) != state.start_time:
            return "stopped"
        if state.creating:
            return "creating"
        return "created" if os.path.exists(self.fifo) else "running"

    def remove(self) -> None:
        self._clear(self.dir)

    @staticmethod
    def _clear(directory: str) -> None:
        """A state directory and what we keep in it (state.json, its .tmp, exec.fifo)."""
        for name in ("state.json", "state.json.tmp", FIFO):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass


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
        kept.update(cgroup=list(dict.fromkeys(cgroup.dirs.values())), cgroup_created=list(cgroup.created))
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
    out = []
    for name in names:
        if valid_id(name):
            sd = StateDir(root, name)
            st = sd._read()
            if st is not None:
                st.status = sd.status(st)
                out.append(st)
    return out
