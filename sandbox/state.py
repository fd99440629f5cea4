"""Container state under ``--root`` (like runc's): one directory per container id, so two
containers can run at once and an id in use is refused."""

from __future__ import annotations

import os
import re
import shutil
import time

import msgspec

from mounts.errors import SandboxError

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


class State(msgspec.Struct):
    id: str
    pid: int
    bundle: str
    status: str
    created: float


class StateDir:
    def __init__(self, root: str, cid: str):
        if not _ID.match(cid):
            raise SandboxError(f"--id {cid!r}: invalid container id (letters, digits, _.+- only)")
        self.dir = os.path.join(root, cid)
        self.id = cid
        self.owned = False

    def create(self, pid: int, bundle: str) -> None:
        try:
            self._create(pid, bundle)
        except OSError as e:
            raise SandboxError(f"--root {os.path.dirname(self.dir)}: cannot create the state directory "
                               f"{self.dir}: {e.strerror}") from None

    def _create(self, pid: int, bundle: str) -> None:
        os.makedirs(os.path.dirname(self.dir), mode=0o711, exist_ok=True)
        try:
            os.mkdir(self.dir, 0o711)
        except FileExistsError:
            old = self._read()
            if old is not None and _alive(old.pid):
                raise SandboxError(f"container id {self.id!r} is in use (pid {old.pid}, {self.dir})") from None
            shutil.rmtree(self.dir, ignore_errors=True)
            os.mkdir(self.dir, 0o711)
        self.owned = True
        self.bundle = bundle
        self.write(State(self.id, pid, bundle, "creating", time.time()))

    def running(self, pid: int) -> None:
        """The container exec'd: record its pid (as the host sees it)."""
        self.write(State(self.id, pid, self.bundle, "running", time.time()))

    def write(self, state: State) -> None:
        tmp = os.path.join(self.dir, "state.json.tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(state))
        os.replace(tmp, os.path.join(self.dir, "state.json"))

    def read(self) -> State | None:
        """The recorded state, or None if there is none (or the container is gone)."""
        state = self._read()
        return state if state is not None and _alive(state.pid) else None

    def _read(self) -> State | None:
        try:
            with open(os.path.join(self.dir, "state.json"), "rb") as f:
                return msgspec.json.decode(f.read(), type=State)
        except (OSError, msgspec.DecodeError):
            return None

    def remove(self) -> None:
        if self.owned:
            shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def list_states(root: str) -> list[State]:
    """The containers under ``root`` that are still alive, by id."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [st for name in names if _ID.match(name) and (st := StateDir(root, name).read()) is not None]
