"""The server's watch on its own code (sandbox/server/listen.py's _CodeWatch): an upgrade
that renames into a directory, a file rewritten or touched, reads as changed; reading the
code does not. With inotify, and with the stamps it falls back to where inotify is refused."""

from __future__ import annotations

import os

import pytest

from gofer import syscalls as sc
from sandbox.server.listen import _CodeWatch


@pytest.fixture(params=["inotify", "stamps"])
def watch_of(request, monkeypatch):
    if request.param == "stamps":
        def refused() -> int:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(sc, "inotify_init", refused)
    return lambda files: _CodeWatch(files)


def _code(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "other.py").write_text("y = 1\n")
    return [str(tmp_path / "pkg"), str(tmp_path / "pkg" / "mod.py"), str(tmp_path / "pkg" / "other.py")]


def test_reads_are_no_change(watch_of, tmp_path):
    files = _code(tmp_path)
    watch = watch_of(files)
    for path in files[1:]:
        with open(path) as f:
            f.read()
        os.stat(path)
    assert os.listdir(files[0]) and not watch.changed()


@pytest.mark.parametrize("change", ["touch the directory", "touch a file", "rewrite a file", "rename into"])
def test_an_upgrade_is_seen_and_stays_seen(watch_of, tmp_path, change):
    files = _code(tmp_path)
    watch = watch_of(files)
    st = os.stat(files[1])
    if change == "touch the directory":
        os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif change == "touch a file":
        os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif change == "rewrite a file":
        with open(files[2], "w") as f:
            f.write("y = 22\n")
    else:
        (tmp_path / "new.py").write_text("x = 2\n")
        os.rename(tmp_path / "new.py", files[1])
    assert watch.changed() and watch.changed()


def test_files_added_later_are_watched_too(watch_of, tmp_path):
    files = _code(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "late.py").write_text("z = 1\n")
    watch = watch_of(files)
    watch.add([str(tmp_path / "sub"), str(tmp_path / "sub" / "late.py")])
    assert not watch.changed()
    with open(tmp_path / "sub" / "late.py", "a") as f:
        f.write("z = 2\n")
    assert watch.changed()


def test_a_change_before_more_files_are_added_is_still_seen(watch_of, tmp_path):
    """(The server adds the files its preload loaded after its start: a change between the
    two must not be taken for the start's state.)"""
    files = _code(tmp_path)
    watch = watch_of(files[:2])
    with open(files[1], "a") as f:
        f.write("x = 3\n")
    watch.add(files[2:])
    assert watch.changed()


def test_out_of_watches_keeps_what_was_seen_and_stamps_after(tmp_path, monkeypatch):
    files = _code(tmp_path)
    watch = _CodeWatch(files)
    (tmp_path / "sub").mkdir()

    def refused(fd: int, path: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sc, "inotify_add", refused)
    watch.add([str(tmp_path / "sub")])
    assert watch.fd is None and not watch.changed()
    with open(files[1], "a") as f:
        f.write("x = 4\n")
    assert watch.changed()
