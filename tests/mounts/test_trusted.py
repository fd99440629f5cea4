"""mounts/trusted.py: a directory is trusted only if every directory and link from / down is
root's and writable by no one else (a sticky one of root's on the way excepted); the error
names the component at fault."""

from __future__ import annotations

import os
import re

import pytest

from mounts.trusted import UntrustedPath, open_root_only

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of other users)")

NOBODY = 65534


@pytest.fixture
def base(tmp_path):
    """A directory of root's, 0755, whose way from / is trusted (pytest's base is root's
    0700, below the sticky /tmp)."""
    d = tmp_path / "base"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    return d


def _dir(path, mode=0o755, uid=0):
    path.mkdir()
    os.chmod(path, mode)
    os.chown(path, uid, uid)
    return path


def _trusted(path) -> bool:
    fd = open_root_only(str(path), "--server X", "why")
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode, uid, fault", [
    (0o755, 0, None),
    (0o700, 0, None),
    (0o755, NOBODY, "owned by uid 65534"),
    (0o775, 0, "writable by its group (mode 0775)"),
    (0o757, 0, "writable by others (mode 0757)"),
    (0o1777, 0, None),  # (on the way: a sticky /tmp of root's)
    (0o1777, NOBODY, "owned by uid 65534"),  # a sticky directory of someone else's
    (0o1775, 0, None),
])
def test_a_directory_on_the_way(base, mode, uid, fault):
    mid = _dir(base / "mid", mode, uid)
    last = _dir(mid / "last", 0o700)
    if fault is None:
        assert _trusted(last)
    else:
        with pytest.raises(UntrustedPath) as e:
            open_root_only(str(last), "--server X", "why")
        assert str(e.value) == (f"--server X: {mid} is {fault} (every directory on the way must be root's and "
                                "writable by no one else: why)")


@pytest.mark.parametrize("mode, fault", [(0o1777, "writable by others (mode 1777)"),
                                         (0o775, "writable by its group (mode 0775)")])
def test_the_last_directory_is_writable_by_no_one_else_sticky_or_not(base, mode, fault):
    """Where the files are kept, a sticky directory is no better: others make names in it."""
    last = _dir(base / "last", mode)
    with pytest.raises(UntrustedPath, match=re.escape(f"{last} is {fault}")):
        open_root_only(str(last), "x", "why")
    if mode & 0o1000:  # (to make a directory of root's in, it will do: as /tmp does)
        os.close(open_root_only(str(last), "x", "why", leaf=False))


def test_links_are_followed_and_must_be_roots(base):
    real = _dir(base / "real", 0o700)
    (base / "link").symlink_to("real")
    assert _trusted(base / "link")
    (base / "abs").symlink_to(real)
    assert _trusted(base / "abs")
    os.chown(base / "link", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UntrustedPath, match=f"{base}/link is a link owned by uid 65534"):
        open_root_only(str(base / "link"), "x", "why")
    theirs = _dir(base / "theirs", 0o755, NOBODY)
    (base / "to-theirs").symlink_to(theirs / "..")  # (through theirs and back: theirs is on the way)
    with pytest.raises(UntrustedPath, match=f"{theirs} is owned by uid 65534"):
        open_root_only(str(base / "to-theirs"), "x", "why")


def test_a_file_or_nothing(base):
    (base / "file").write_text("")
    with pytest.raises(UntrustedPath, match=f"{base}/file is not a directory"):
        open_root_only(str(base / "file"), "x", "why")
    with pytest.raises(FileNotFoundError):
        open_root_only(str(base / "nothing"), "x", "why")
    with pytest.raises(UntrustedPath, match="not an absolute path"):
        open_root_only("relative", "x", "why")
