"""The warm server's cache of exported seccomp filters (gofer/seccomp.py's export): a profile
met before is read back, not compiled again; nothing but whole instructions of our own writing
is ever used."""

from __future__ import annotations

import hashlib
import json
import os

import fixtures
import msgspec
import pytest

from gofer import seccomp
from mounts.spec import Seccomp

PROFILE = msgspec.json.decode(json.dumps(fixtures.engine_seccomp_profile()), type=Seccomp)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    try:
        seccomp.sc.Seccomp.lib()
    except OSError:
        pytest.skip("no libseccomp here")
    monkeypatch.setattr(seccomp, "CACHE", str(tmp_path))
    return tmp_path


def _compiled(spec: Seccomp) -> bytes:
    return seccomp.compile_filter(spec).export_bpf()


def _no_compiling(monkeypatch):
    def refuse(spec):
        raise AssertionError("compiled again")

    monkeypatch.setattr(seccomp, "compile_filter", refuse)


def test_without_a_cache_the_filter_is_compiled(monkeypatch):
    monkeypatch.setattr(seccomp, "CACHE", None)
    try:
        bpf = seccomp.export(PROFILE)
    except OSError:
        pytest.skip("no libseccomp here")
    assert bpf == _compiled(PROFILE) and len(bpf) % 8 == 0


def test_a_profile_is_compiled_once(cache, monkeypatch):
    first = seccomp.export(PROFILE)
    assert first == _compiled(PROFILE)
    assert len(os.listdir(cache)) == 1
    other = msgspec.structs.replace(PROFILE, default_errno_ret=13)
    assert seccomp.export(other) == _compiled(other) != first
    assert len(os.listdir(cache)) == 2
    _no_compiling(monkeypatch)
    assert seccomp.export(PROFILE) == first


def test_only_whole_instructions_of_ours_are_used(cache, monkeypatch):
    """A torn file is compiled over; a link in a key's place is never followed nor replaced."""
    first = seccomp.export(PROFILE)
    (key,) = os.listdir(cache)
    (cache / key).write_bytes(first[:-3])
    assert seccomp.export(PROFILE) == first
    assert (cache / key).read_bytes() == first
    target = cache.parent / "elsewhere"
    target.write_bytes(b"\0" * 8)
    (cache / key).unlink()
    (cache / key).symlink_to(target)
    assert seccomp.export(PROFILE) == first
    assert (cache / key).is_symlink() and target.read_bytes() == b"\0" * 8


def test_a_full_cache_is_not_written(cache, monkeypatch):
    monkeypatch.setattr(seccomp, "MAX_CACHED", 0)
    assert seccomp.export(PROFILE) == _compiled(PROFILE)
    assert os.listdir(cache) == []


def test_a_file_anyone_else_could_have_written_is_not_used(cache):
    """Whole instructions, but readable by others, or with a second name: not of our writing."""
    first = seccomp.export(PROFILE)
    (key,) = os.listdir(cache)
    other = msgspec.structs.replace(PROFILE, default_errno_ret=13)
    planted = seccomp.compile_filter(other).export_bpf()
    (cache / key).write_bytes(planted)
    (cache / key).chmod(0o644)
    assert seccomp.export(PROFILE) == first
    (cache / key).chmod(0o600)
    os.link(cache / key, cache.parent / "second-name")
    (cache / key).write_bytes(planted)  # (through the link: both names)
    assert seccomp.export(PROFILE) == first
    if os.geteuid() == 0:
        (cache / key).write_bytes(planted)
        (cache / key).chmod(0o600)
        os.chown(cache / key, 1, 1)  # (another user's)
        assert seccomp.export(PROFILE) == first


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a directory of another user's)")
def test_a_cache_below_another_users_directory_is_not_used(cache, monkeypatch):
    """Filters of our own writing, whole, root's alone, one name, but in a directory whose way
    from / has one of another user's on it: they could have swapped two of ours by renaming
    (issue #29: the red team made a served container's mkdir-denying filter an allowing one).
    Neither read nor written."""
    theirs = cache / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    own = theirs / "srv.sock.bpf"
    own.mkdir(mode=0o700)
    monkeypatch.setattr(seccomp, "CACHE", str(own))
    planted = _compiled(msgspec.structs.replace(PROFILE, default_errno_ret=13))
    key = hashlib.sha256(msgspec.json.encode(PROFILE)).hexdigest()
    (own / key).write_bytes(planted)
    (own / key).chmod(0o600)
    assert seccomp.export(PROFILE) == _compiled(PROFILE) != planted
    assert os.listdir(own) == [key]  # (and nothing of ours written there)
    os.chown(theirs, 0, 0)
    assert seccomp.export(PROFILE) == planted  # (the same files, under a way of root's alone: used)
