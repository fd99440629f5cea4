"""The embedded root's reading of mountinfo, and the directories it overlays (gofer/root.py)."""

from gofer.root import Mount, _mounts_below, outermost, parse_mountinfo


def test_a_line_with_optional_fields_and_escapes():
    line = r"36 35 98:0 /sub\040dir /mnt/a\040b rw,noatime shared:1 master:2 - tmpfs tmp\040fs rw,size=64k" + "\n"
    assert parse_mountinfo(line) == Mount("36", "/sub dir", "/mnt/a b", "rw,noatime", "tmpfs")


def test_a_line_without_optional_fields():
    assert parse_mountinfo("1 0 0:5 / /dev ro,nosuid - devtmpfs udev rw\n") == Mount("1", "/", "/dev", "ro,nosuid",
                                                                                     "devtmpfs")


def test_mounts_below_are_the_outermost_in_mount_order():
    table = [parse_mountinfo(f"{i} 1 0:1 / {p} rw - tmpfs t rw") for i, p in enumerate(
        ["/", "/r", "/r/dev", "/r/dev/pts", "/rx", "/r/proc", "/r/dev", "/other"])]
    assert _mounts_below("/r", table) == ["/r/dev", "/r/proc"]
    assert _mounts_below("/r/", table) == ["/r/dev", "/r/proc"]
    assert _mounts_below("/r/dev", table) == ["/r/dev/pts"]
    assert _mounts_below("/none", table) == []


def test_a_mount_covered_by_a_later_one_is_not_put_back():
    """/r/a/b, then /r/a mounted over it: /r/a/b is hidden (cloning it by path through the
    later /r/a would fail, or take another's), only /r/a goes back."""
    table = [parse_mountinfo(f"{i} 1 0:1 / {p} rw - tmpfs t rw") for i, p in enumerate(["/r/a/b", "/r/c", "/r/a"])]
    assert _mounts_below("/r", table) == ["/r/c", "/r/a"]


def test_the_overlaid_directories_are_the_outermost_parents_first():
    """prepare's overlays never lie below one another (one mount table serves them all):
    the root, where wanted, is the only one, as "/" and "/usr" have one name each."""
    assert outermost(["/usr", "/", "/usr/lib"]) == ["/"]
    assert outermost(["/usr/lib/x86_64-linux-gnu", "/usr/bin", "/etc", "/usr/lib"]) == ["/etc", "/usr/bin", "/usr/lib"]
    assert outermost(["/r/usr/lib", "/r/usr/lib2", "/r/usr/lib/nvidia"]) == ["/r/usr/lib", "/r/usr/lib2"]
