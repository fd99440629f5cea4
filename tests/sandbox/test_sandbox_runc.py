"""scripts/sandbox-runc's routing, with stand-ins for both runtimes that print their argv:
which runtime a command line goes to, and with what --root."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

WRAPPER = str(Path(__file__).resolve().parents[2] / "scripts/sandbox-runc")


@pytest.fixture
def route(tmp_path):
    for name in ("fake-sandbox", "fake-runc"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho {name} "$@"\n')
        (tmp_path / name).chmod(0o755)
    env = dict(os.environ, SANDBOX=str(tmp_path / "fake-sandbox"), SANDBOX_RUNC=str(tmp_path / "fake-runc"))

    def run(*args: str) -> str:
        return subprocess.run([WRAPPER, *args], capture_output=True, text=True, env=env, check=True).stdout.strip()
    return run


def bundle(tmp_path, name: str, env: list[str], text: str | None = None) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(text or json.dumps({"process": {"env": env}}))
    return str(d)


def test_gpu_or_not_decides_create(route, tmp_path):
    gpu, plain = bundle(tmp_path, "g", ["NVIDIA_VISIBLE_DEVICES=all"]), bundle(tmp_path, "p", ["A=1"])
    void = bundle(tmp_path, "v", ["NVIDIA_VISIBLE_DEVICES="])
    escaped = bundle(tmp_path, "e", [], text='{"linux": {"devices": [{"path": "\\/dev\\/nvidiactl"}]}}')
    root = str(tmp_path / "r")
    assert route("--root", root, "create", "-b", gpu, "c1").startswith(f"fake-sandbox --root {root} --root {root}.sandbox")
    assert route("--root", root, "--driver-root", "/d", "create", "--bundle", plain, "c2") == \
        f"fake-runc --root {root} create --bundle {plain} c2"  # sandbox's own flag dropped for runc
    assert route("--root", root, "create", "-b", void, "c3").startswith("fake-runc")
    assert route("--root", root, "create", "-b", escaped, "c4").startswith("fake-sandbox")  # \/ could hide one


def test_later_verbs_go_where_the_state_is(route, tmp_path):
    root = tmp_path / "r"
    (root.parent / "r.sandbox" / "ours").mkdir(parents=True)
    (root.parent / "r.sandbox" / "ours" / "state.json").write_text("{}")
    assert route("--root", str(root), "delete", "-f", "ours").startswith("fake-sandbox")  # -f: --force, no value
    assert route("--root", f"{root}/", "kill", "ours", "9").startswith("fake-sandbox")  # a trailing slash
    assert route("-root", str(root), "state", "ours").startswith("fake-sandbox")  # urfave's single dash
    assert route("--root", str(root), "exec", "-g", "5", "--cgroup", "x", "ours", "true").startswith("fake-sandbox")
    assert route("--root", str(root), "delete", "-f", "theirs").startswith("fake-runc")
    assert route("--root", str(root), "ps", "-f", "json", "ours").startswith("fake-sandbox")
    assert route("--root", str(root), "list").startswith("fake-runc")
    assert route("--root", str(root), "update", "--memory", "1G", "--pids-limit", "9", "ours").startswith(
        "fake-sandbox")  # update's values are not the id
