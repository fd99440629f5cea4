"""The state directory (``--root``, runc's layout): one directory per container id holding
``state.json`` and, between create and start, the ``exec.fifo`` its init waits on.

Liveness is the init's pid *and* its start time (field 22 of /proc/PID/stat), recorded at
create: a recycled pid is never taken for the container. The status is derived, never
stored: ``creating`` until the init is ready, ``created`` while the FIFO exists, ``running``
after start, ``stopped`` once the init is gone (or a zombie nobody reaped yet).

Kept small and free of heavy imports: every verb but create pays for this module.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import msgspec

from mounts.errors import SandboxError
from mounts.spec import Hook

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}$")
FIFO = "exec.fifo"
OCI_VERSION = "1.0.2"


class State(msgspec.Struct, omit_defaults=True):
    """What state.json holds (and, with the derived status, what ``sandbox state`` prints)."""

    ociVersion: str  # noqa: N815 - the OCI state's own field names
    id: str
    status: str
    pid: int
    bundle: str
    rootfs: str = ""
    created: str = ""
    owner: str = ""
    annotations: dict[str, str] = {}
    start_time: int = 0  # clock ticks after boot, /proc/PID/stat field 22
    creating: bool = False  # the init has not reported ready yet
    foreground: bool = False  # kept by `sandbox run BUNDLE`, removed when it ends
    poststart: list[Hook] = []  # the bundle's, for start and delete to run
    poststop: list[Hook] = []

    def public(self) -> dict:
        """The OCI state (plus runc's rootfs, created, owner) as `sandbox state` prints it."""
        out = {"ociVersion": self.ociVersion, "id": self.id, "pid": self.pid if self.status != "stopped" else 0,
               "status": self.status, "bundle": self.bundle, "rootfs": self.rootfs, "created": self.created,
               "owner": self.owner}
        if self.annotations:
            out["annotations"] = self.annotations
        return out


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


class StateDir:
    def __init__(self, root: str, cid: str):
        if not _ID.match(cid):
            raise SandboxError(f"container id {cid!r} is invalid (letters, digits, _.+- only)")
        self.root = root
        self.dir = os.path.join(root, cid)
        self.id = cid
        self.owned = False

    @property
    def fifo(self) -> str:
        return os.path.join(self.dir, FIFO)

    def create(self, state: State, fifo: bool = False) -> None:
        """Claim the id: mkdir is atomic, so of two creates of one id exactly one wins. A
        directory left by a crashed create (no readable state) or a foreground run whose
        init is gone is replaced; anything else is "already exists", as runc says."""
        try:
            os.makedirs(self.root, mode=0o711, exist_ok=True)
            try:
                os.mkdir(self.dir, 0o711)
            except FileExistsError:
                old = self._read()
                if old is not None and not (old.foreground and self.status(old) == "stopped"):
                    raise SandboxError(f"container {self.id!r} already exists ({self.dir})") from None
                shutil.rmtree(self.dir, ignore_errors=True)
                os.mkdir(self.dir, 0o711)  # a concurrent replacer loses here
            self.owned = True
            if fifo:
                os.mkfifo(self.fifo, 0o622)
            self.write(state)
        except OSError as e:
            raise SandboxError(f"--root {self.root}: cannot create the state directory {self.dir}: "
                               f"{e.strerror}") from None

    def write(self, state: State) -> None:
        tmp = os.path.join(self.dir, "state.json.tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(state))
        os.replace(tmp, os.path.join(self.dir, "state.json"))

    def load(self) -> State:
        """The recorded state with its status derived; an error naming the id if none."""
        state = self._read()
        if state is None:
            raise SandboxError(f"container {self.id!r} does not exist (under {self.root})")
        state.status = self.status(state)
        return state

    def _read(self) -> State | None:
        try:
            with open(os.path.join(self.dir, "state.json"), "rb") as f:
                return msgspec.json.decode(f.read(), type=State)
        except (OSError, msgspec.DecodeError):
            return None

    def status(self, state: State) -> str:
        if state.pid <= 0 or start_time(state.pid) != state.start_time:
            return "stopped"
        if state.creating:
            return "creating"
        return "created" if os.path.exists(self.fifo) else "running"

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def new_state(cid: str, pid: int, bundle: str, rootfs: str = "", annotations: dict | None = None,
              creating: bool = True, foreground: bool = False, hooks=None) -> State:
    now = time.time_ns()
    created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
    return State(OCI_VERSION, cid, "creating", pid, bundle, rootfs, created, "", dict(annotations or {}),
                 start_time(pid) or 0, creating, foreground, list(hooks.poststart) if hooks else [],
                 list(hooks.poststop) if hooks else [])


def list_states(root: str) -> list[State]:
    """Every container recorded under ``root``, by id, with its status."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if _ID.match(name):
            sd = StateDir(root, name)
            st = sd._read()
            if st is not None:
                st.status = sd.status(st)
                out.append(st)
    return out
