"""What tests/integration/test_package.py and test_kubernetes.py share: the package built once
per session (scripts/package), a booted Debian 12 node (scripts/debroot.py), what is missing
for either (a skip, with the reason), the shell commands of a doc page, and a picture of a
root's files to compare before and after."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import mount_table, processes_naming

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import debroot  # noqa: E402


def missing() -> str | None:
    """Why the package cannot be built and booted here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("dpkg-deb", "dpkg-shlibdeps", "gcc", "nsenter", "unshare", "tar"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup installs it)"
    if not Path("/usr/bin/python3").exists() or not list(Path("/usr/include").glob("python3.*/Python.h")):
        return "Debian's python3 and python3-dev are needed (scripts/setup installs them)"
    if not Path("/usr/include/sys/capability.h").exists():
        return "libcap-dev is missing (scripts/setup installs it)"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed here (systemd-nspawn comes from its version)"
    return None


def build_package(base: Path) -> Path:
    """``scripts/package --out base/dist``, once per session (``base``: the session's temp dir)."""
    out = base / "dist"
    found = sorted(out.glob("gpu-sandbox_*_amd64.deb")) if out.is_dir() else []
    if found:
        return found[-1]
    r = subprocess.run([str(REPO / "scripts/package"), "--out", str(out)], capture_output=True, text=True,
                       timeout=900)
    if r.returncode == 75:  # (no PyPI, and no wheelhouse from an earlier build)
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr[-4000:]
    return Path(r.stdout.strip().splitlines()[-1])


def root_tarball() -> Path:
    try:
        return debroot.root_tarball()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no Debian root could be made here: {str(e)[-500:]}")


def nspawn() -> Path:
    try:
        return debroot.nspawn()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"systemd-nspawn of this host's systemd version could not be fetched: {e}")


def doc_commands(page: Path) -> list[str]:
    """The commands of the ```sh blocks of a doc page, in order (a line ending in a backslash
    goes on with the next)."""
    commands, block, pending = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = line.strip() == "```sh" if not block else False
            continue
        if block and line.strip():
            pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
            if not line.endswith("\\"):
                commands.append(re.sub(r"\s+", " ", pending))
                pending = ""
    return commands


SKIP = ("proc", "sys", "dev", "run", "tmp")


def picture(root: Path, contents: tuple[str, ...] = ("etc",)) -> dict[str, str]:
    """Every path below ``root`` (but its /proc, /sys, /dev, /run, /tmp) -> its kind, and for
    a file below ``contents``, its content's hash."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in SKIP]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            key = os.path.normpath(os.path.join(rel, name))
            if os.path.islink(path):
                seen[key] = "link " + os.readlink(path)
            elif os.path.isdir(path):
                seen[key] = "dir"
            elif key.startswith(contents):
                with open(path, "rb") as f:
                    seen[key] = "file " + hashlib.sha256(f.read()).hexdigest()[:16]
            else:
                seen[key] = "file"
    return seen


def left_behind(base: Path, mounts_before: list) -> list[str]:
    """Mounts below ``base`` that were not there before, and live processes whose command line
    names it (the node's nspawn, podman's conmon, a shim): none once a test has cleaned up."""
    found = [f"mount {m}" for m in set(mount_table()) - set(mounts_before) if m[0].startswith(str(base))]
    return found + [f"process {pid}" for pid in processes_naming(base)]
