"""Under the systemd driver a container's v1 cgroup is frozen around SetUnitProperties
(gofer/systemd.py set_properties): by `update`, and by create's seal() that adds the GPU
nodes while the gofer makes /dev (systemd's rewrite of the devices denied it /dev/null);
thawed whatever happens, and a cgroup frozen by someone else is left frozen."""

from __future__ import annotations

import os
import uuid

import pytest

from gofer import systemd
from mounts.errors import SandboxError

FREEZER = "/sys/fs/cgroup/freezer"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir(FREEZER), reason="needs root and a v1 freezer")


@pytest.fixture
def cgroup():
    d = os.path.join(FREEZER, f"sandbox-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(d)
    yield d
    with open(os.path.join(d, "freezer.state"), "w") as f:
        f.write("THAWED")
    os.rmdir(d)


def _state(d: str) -> str:
    with open(os.path.join(d, "freezer.state")) as f:
        return f.read().strip()


class Unreachable:
    def __init__(self):
        raise SandboxError("--systemd-cgroup: cannot reach systemd over D-Bus (a test's)")


class Recording:
    seen: list[str] = []

    def __init__(self, where=None):
        self.where = where

    def call(self, *args, **kw):
        Recording.seen.append(_state(self.where))

    def close(self):
        pass


def test_frozen_while_systemd_sets_and_thawed_after(cgroup, monkeypatch):
    monkeypatch.setattr(systemd, "Bus", lambda: Recording(cgroup))
    Recording.seen = []
    systemd.set_properties("x.scope", [("TasksMax", ("t", 10))], frozen=["/nonexistent", cgroup])
    assert Recording.seen == ["FROZEN"] and _state(cgroup) == "THAWED"


def test_thawed_when_systemd_cannot_be_reached(cgroup, monkeypatch):
    monkeypatch.setattr(systemd, "Bus", Unreachable)
    with pytest.raises(SandboxError, match="cannot reach systemd"):
        systemd.set_properties("x.scope", [("TasksMax", ("t", 10))], frozen=[cgroup])
    assert _state(cgroup) == "THAWED"


def test_a_cgroup_frozen_by_someone_else_stays_frozen(cgroup, monkeypatch):
    with open(os.path.join(cgroup, "freezer.state"), "w") as f:
        f.write("FROZEN")
    monkeypatch.setattr(systemd, "Bus", lambda: Recording(cgroup))
    systemd.set_properties("x.scope", [("TasksMax", ("t", 10))], frozen=[cgroup])
    assert _state(cgroup) == "FROZEN"


def test_create_adds_the_gpu_nodes_frozen(cgroup, monkeypatch):
    unit = systemd.SystemdCgroup("system.slice:demo:x", "x")
    unit.dirs = {"freezer": cgroup}
    unit.allow(195, 0)
    monkeypatch.setattr(systemd, "Bus", lambda: Recording(cgroup))
    Recording.seen = []
    unit.seal()
    assert Recording.seen == ["FROZEN"] and _state(cgroup) == "THAWED"
