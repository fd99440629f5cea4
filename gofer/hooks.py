"""The bundle's own OCI hooks, run as the runtime spec says: each with the container's state
JSON on stdin, its own ``args`` and ``env`` only (nothing of ours or of the image's:
CVE-2025-23266), from "/", with its ``timeout``; a hook that fails or times out fails the
step it belongs to (create, start), except poststart and poststop, which only warn.

Who runs which (docs/design.md, "Hooks"): prestart and createRuntime in the runtime's
namespaces (the supervisor, while the gofer waits before pivot_root); createContainer in the
container's mount namespace before pivot_root (the gofer); startContainer inside the
container after start, before the process execs (the init); poststart (start) and
poststop (delete) in the runtime's namespaces.
"""

from __future__ import annotations

import msgspec

from mounts import OCI_VERSION
from mounts.errors import SandboxError
from mounts.spec import Hook


def run_hooks(hooks: list[Hook], stage: str, state: bytes) -> None:
    """Run ``hooks`` in order; the first failure raises a one-line SandboxError. (subprocess
    is imported here, ~4 ms, only by a container that has hooks; for startContainer the
    gofer imports it before pivot_root, see gofer/main.py.)"""
    if not hooks:
        return
    import os

    umask = os.umask(0o022)  # the gofer works with umask 0; a hook's files must not be 0666
    try:
        for i, hook in enumerate(hooks):
            _run(i, hook, stage, state)
    finally:
        os.umask(umask)


def _run(i: int, hook: Hook, stage: str, state: bytes) -> None:
    import subprocess

    argv = hook.args or [hook.path]
    try:
        r = subprocess.run(argv, executable=hook.path, input=state, env=dict(
            item.partition("=")[::2] for item in hook.env), cwd="/", capture_output=True,
            timeout=hook.timeout, close_fds=True)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"hooks.{stage}[{i}] {hook.path}: timed out after {hook.timeout}s",
                           op="hook", path=hook.path) from None
    except OSError as e:
        raise SandboxError(f"hooks.{stage}[{i}] {hook.path}: {e.strerror}", op="hook",
                           path=hook.path) from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()[-1:]
        raise SandboxError(f"hooks.{stage}[{i}] {hook.path}: exit status {r.returncode}"
                           + (f": {tail[0]}" if tail else ""), op="hook", path=hook.path)


def state(cid: str, status: str, pid: int, bundle: str, annotations: dict[str, str]) -> dict:
    """The container state (runtime-spec's), as hooks and seccomp agents receive it."""
    return {"ociVersion": OCI_VERSION, "id": cid, "status": status, "pid": pid, "bundle": bundle,
            "annotations": annotations}


def state_json(cid: str, status: str, pid: int, bundle: str, annotations: dict[str, str]) -> bytes:
    return msgspec.json.encode(state(cid, status, pid, bundle, annotations))
