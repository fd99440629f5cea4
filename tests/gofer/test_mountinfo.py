"""The embedded root's reading of mountinfo (gofer/root.py): the fields it decides by."""

from gofer.root import Mount, _mounts_below, parse_mountinfo


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
