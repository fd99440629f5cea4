"""A kept inventory (mounts/inventories.py): reused while nothing discovery read has changed,
discovered again after each change a node sees (a library upgraded, the module reloaded, a
GPU or a MIG instance going or coming, a device node made again), and a racy recording
never reused. On a copy of the fixture driver root (hard links: files are replaced here,
never written in place, so the shared fixture is never changed)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from mounts import inventories, reads
from mounts.errors import DriverError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hard links of the fixture's root-owned files")


@pytest.fixture
def root(driver_root, tmp_path, monkeypatch):
    """A private copy of the fixture driver root, its answers settled at once (RACY 0: the
    copy's ctimes are new) and no inventory kept from another test."""
    copy = tmp_path / "drv"
    subprocess.run(["cp", "-al", str(driver_root), str(copy)], check=True)
    monkeypatch.setattr(reads, "RACY", 0.0)
    monkeypatch.setattr(inventories, "_kept", {})
    return str(copy)


def _replace(path: str, text: str | None = None) -> None:
    """A new file at ``path`` (as a package manager writes it), of ``text`` or the old bytes."""
    data = text.encode() if text is not None else open(path, "rb").read()
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


def test_kept_while_nothing_changed(root):
    first, kept = inventories.inventory(root)
    assert not kept
    again, kept = inventories.inventory(root)
    assert kept and again is first
    assert inventories.inventory(root, root)[1] is False  # (another key: a device root given)


def test_a_library_replaced_is_read_again(root):
    first, _ = inventories.inventory(root)
    lib = next(lib for lib in first.libraries if lib.key == "libcuda.so.1")
    _replace(lib.path)
    again, kept = inventories.inventory(root)
    assert not kept and again == first and again is not first
    assert inventories.inventory(root)[1]


def test_a_library_gone(root):
    first, _ = inventories.inventory(root)
    lib = next(lib for lib in first.libraries if lib.key == "libnvidia-ml.so.1")
    os.unlink(lib.path)
    again, kept = inventories.inventory(root)
    assert not kept and "libnvidia-ml.so.1" not in {x.key for x in again.libraries}


def test_a_reloaded_module_of_another_version(root):
    first, _ = inventories.inventory(root)
    version = os.path.join(root, "proc/driver/nvidia/version")
    text = open(version).read()
    _replace(version, text.replace(first.version, "999.1.2"))
    with pytest.raises(DriverError, match="999.1.2 does not match"):
        inventories.inventory(root)
    _replace(version, text)
    assert inventories.inventory(root)[0] == first


def test_a_gpu_going_and_coming(root):
    first, _ = inventories.inventory(root)
    assert len(first.gpus) == 2
    gpus = os.path.join(root, "proc/driver/nvidia/gpus")
    busid = sorted(os.listdir(gpus))[1]
    shutil.move(os.path.join(gpus, busid), os.path.join(root, "gone"))
    less, kept = inventories.inventory(root)
    assert not kept and [g.busid for g in less.gpus] == [first.gpus[0].busid]
    assert "nvidia1" not in less.devices
    shutil.move(os.path.join(root, "gone"), os.path.join(gpus, busid))
    assert inventories.inventory(root) == (first, False)


def test_a_mig_instance_going(root):
    first, _ = inventories.inventory(root)
    assert len(first.migs) >= 2
    shutil.rmtree(os.path.join(root, "proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci1"))
    less, kept = inventories.inventory(root)
    assert not kept and len(less.migs) == len(first.migs) - 1


def test_a_device_node_made_again_or_gone(root):
    first, _ = inventories.inventory(root)
    node = os.path.join(root, "dev/nvidia-uvm-tools")
    st = os.stat(node)
    os.unlink(node)
    less, kept = inventories.inventory(root)
    assert not kept and "nvidia-uvm-tools" not in less.devices
    os.mknod(node, st.st_mode, st.st_rdev)
    again, kept = inventories.inventory(root)
    assert not kept and again == first


def test_a_recording_of_files_just_changed_is_not_kept(root, monkeypatch):
    """A change within the clock's tick of the read could keep a file's times: an answer
    newer than RACY seconds is not trusted, and the next call discovers again."""
    monkeypatch.setattr(reads, "RACY", 60.0)
    lib = next(lib for lib in inventories.inventory(root)[0].libraries if lib.key == "libcuda.so.1")
    _replace(lib.path)
    assert inventories.inventory(root)[1] is False
    assert inventories.inventory(root)[1] is False  # (the ctime is too new still)
    monkeypatch.setattr(reads, "RACY", 0.0)  # (as if a minute had passed)
    assert inventories.inventory(root)[1] is False
    assert inventories.inventory(root)[1] is True


def test_a_child_reports_to_its_server(root, monkeypatch):
    """What a forked child discovered comes back to the server, which keeps it for the next."""
    ours, theirs = inventories.report_pair()
    monkeypatch.setattr(inventories, "REPORT", theirs)
    pid = os.fork()
    if pid == 0:
        try:
            inventories.inventory(root)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert inventories._kept == {}
    inventories.receive(ours)
    found, kept = inventories.inventory(root)
    assert kept and found.version
    ours.close()
    theirs.close()


def test_a_name_that_is_no_utf8_is_discovered_not_reported(root, monkeypatch):
    """A listing with an undecodable name (a lone surrogate for msgpack): the child's own
    discovery stands, it only goes unreported (it used to raise)."""
    platforms = os.path.join(root, "usr/share/egl/egl_external_platform.d")
    os.makedirs(platforms, exist_ok=True)
    open(os.fsencode(platforms) + b"/caf\xe9.conf", "w").close()
    ours, theirs = inventories.report_pair()
    monkeypatch.setattr(inventories, "REPORT", theirs)
    try:
        assert inventories.inventory(root)[0].version
        monkeypatch.setattr(inventories, "_kept", {})
        inventories.receive(ours)
        assert inventories._kept == {}
    finally:
        ours.close()
        theirs.close()


def test_the_server_keeps_only_reports_of_a_discovery(root):
    """A datagram that is no msgpack, or a report whose answers never asked about its root
    (it would be 'unchanged' for good), is dropped; the server goes on."""
    import msgspec

    found, _ = inventories.inventory(root)
    inventories._kept.clear()
    ours, theirs = inventories.report_pair()
    try:
        theirs.send(b"\xc1")
        theirs.send(msgspec.msgpack.encode(inventories.Kept((root, "", "", ""), found, [])))
        inventories.receive(ours)
        assert inventories._kept == {}
    finally:
        ours.close()
        theirs.close()


def test_at_most_max_kept_roots(root, monkeypatch):
    monkeypatch.setattr(inventories, "MAX_KEPT", 2)
    for path in (root, root + "/", root + "/."):
        inventories.inventory(path)
    assert list(inventories._kept) == [(root + "/", "", "", os.environ.get("PATH", "")),
                                       (root + "/.", "", "", os.environ.get("PATH", ""))]
