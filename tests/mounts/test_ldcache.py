import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mounts import ldcache
from mounts.errors import LdCacheError


def libcmp(a: str, b: str) -> int:
    """The oracle for the writer's order: glibc's _dl_cache_libcmp, transcribed. Runs of
    digits compare as numbers, digits after non-digits, other bytes as x86's signed chars."""
    x, y = a.encode(), b.encode()
    i = j = 0
    while i < len(x):
        cx = x[i]
        cy = y[j] if j < len(y) else 0
        if 48 <= cx <= 57:
            if not 48 <= cy <= 57:
                return 1
            m, n = i, j
            while m < len(x) and 48 <= x[m] <= 57:
                m += 1
            while n < len(y) and 48 <= y[n] <= 57:
                n += 1
            diff = int(x[i:m]) - int(y[j:n])
            if diff:
                return diff
            i, j = m, n
        elif 48 <= cy <= 57:
            return -1
        elif cx != cy:  # glibc compares (signed, on x86) chars
            return (cx - 256 if cx > 127 else cx) - (cy - 256 if cy > 127 else cy)
        else:
            i += 1
            j += 1
    rest = y[j] if j < len(y) else 0
    return -(rest - 256 if rest > 127 else rest)


LINE = re.compile(r"^\t(\S+) \(([^)]*)\) => (.+)$")


def ldconfig_p(path) -> list[tuple[str, bool, str]]:
    """(key, is 64-bit, value) as glibc's ldconfig -p prints them, in order."""
    out = subprocess.run(["ldconfig", "-p", "-C", str(path)], capture_output=True, text=True, check=True)
    rows = []
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((m.group(1), "x86-64" in m.group(2), m.group(3)))
    return rows


def ours(path) -> list[tuple[str, bool, str]]:
    return [(e.key, e.is_64bit, e.value) for e in ldcache.read(str(path))]


@pytest.mark.parametrize("which", ["host", "driver"])
def test_reader_matches_ldconfig(which, driver_root):
    path = "/etc/ld.so.cache" if which == "host" else driver_root / "etc/ld.so.cache"
    expected = ldconfig_p(path)
    assert expected, "the oracle printed nothing"
    assert ours(path) == expected


@pytest.mark.parametrize("fmt", ["old", "compat", "new"])
def test_reader_formats_match_ldconfig(fmt, tmp_path, rootfs_lib64):
    root = tmp_path / "root"
    shutil.copytree(rootfs_lib64, root, symlinks=True)
    subprocess.run(["ldconfig", "-c", fmt, "-C", "/etc/test.cache", "-r", str(root)], check=True)
    path = root / "etc/test.cache"
    data = path.read_bytes()
    assert data.startswith(ldcache.OLD_MAGIC if fmt != "new" else ldcache.NEW_MAGIC)
    assert ours(path) == ldconfig_p(path) and len(ours(path)) == 6


def test_libcmp_sorts_like_ldconfig():
    host = ldcache.read("/etc/ld.so.cache")
    assert ldcache.sort_entries(list(reversed(host))) == host


def test_libcmp_digits_compare_as_numbers():
    assert libcmp("libfoo.so.10", "libfoo.so.9") > 0
    assert libcmp("libfoo.so.1", "libfoo.so.1") == 0
    assert libcmp("libfoo.so", "libfoo.so.1") < 0
    assert libcmp("lib2", "libx") > 0  # a digit sorts after any other character


def test_writer_lists_exactly_the_entries(tmp_path, driver_root):
    entries = ldcache.read(str(driver_root / "etc/ld.so.cache"))[::-1]
    entries.append(ldcache.Entry("libi386only.so.1", "/usr/lib/i386-linux-gnu/libi386only.so.1", ldcache.FLAGS_I386))
    path = tmp_path / "ld.so.cache"
    path.write_bytes(ldcache.build(entries))
    got = ldconfig_p(path)
    assert sorted(got) == sorted((e.key, e.is_64bit, e.value) for e in entries)
    assert ours(path) == got


def test_loader_finds_library_only_the_written_cache_points_to(tmp_path, rootfs_debian):
    """glibc's loader, chrooted into a copy of the rootfs, finds /opt/hidden/libhidden.so.1
    through the cache we wrote, and not without it."""
    root = tmp_path / "root"
    shutil.copytree(rootfs_debian, root, symlinks=True)
    (root / "opt/hidden").mkdir(parents=True)
    src = tmp_path / "hidden.c"
    src.write_text("int cuInit(unsigned flags) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libhidden.so.1", "-o",
                    str(root / "opt/hidden/libhidden.so.1"), str(src)], check=True)
    base = ldcache.read(str(root / "etc/ld.so.cache"))

    def attempt(entries):
        (root / "etc/ld.so.cache").write_bytes(ldcache.build(entries))
        return subprocess.run(["chroot", str(root), "/usr/bin/cudacheck", "libhidden.so.1"],
                              capture_output=True, text=True)

    without = attempt(base)
    assert without.returncode == 2 and "libhidden.so.1" in without.stderr
    added = ldcache.Entry("libhidden.so.1", "/opt/hidden/libhidden.so.1")
    found = attempt(ldcache.merge(base, [added]))
    assert found.returncode == 0, found.stderr
    assert "cuInit found" in found.stdout


def test_merge_replaces_same_key_and_keeps_the_rest():
    base = [ldcache.Entry("libc.so.6", "/lib/libc.so.6"), ldcache.Entry("libcuda.so.1", "/old/libcuda.so.1")]
    new = [ldcache.Entry("libcuda.so.1", "/new/libcuda.so.1")]
    assert ldcache.merge(base, new) == [base[0], new[0]]


def test_truncations_give_clear_errors(driver_root):
    data = (driver_root / "etc/ld.so.cache").read_bytes()
    for n in list(range(0, 200)) + list(range(len(data) - 300, len(data) - 1)):
        try:
            ldcache.parse(data[:n], "cut.cache")
        except LdCacheError as e:
            assert str(e).startswith("cut.cache: ")


def test_bad_offsets_are_bounds_checked(driver_root):
    data = bytearray((driver_root / "etc/ld.so.cache").read_bytes())
    # first entry's key offset -> far outside the file
    data[48 + 4:48 + 8] = (10**9).to_bytes(4, "little")
    with pytest.raises(LdCacheError, match="outside the file"):
        ldcache.parse(bytes(data), "bad.cache")
    data = bytearray((driver_root / "etc/ld.so.cache").read_bytes())
    data[20:24] = (10**8).to_bytes(4, "little")  # nlibs
    with pytest.raises(LdCacheError, match="do not fit"):
        ldcache.parse(bytes(data), "bad.cache")


def test_not_a_cache():
    with pytest.raises(LdCacheError, match="bad magic"):
        ldcache.parse(b"\x7fELF" + bytes(100), "x")
    with pytest.raises(LdCacheError, match="cannot read"):
        ldcache.read("/nonexistent/ld.so.cache")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzzed_caches_parse_or_fail_cleanly(data):
    good = ldcache.build([ldcache.Entry(f"libx{i}.so.1", f"/usr/lib/libx{i}.so.1") for i in range(4)])
    blob = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    try:
        entries = ldcache.parse(bytes(blob), "fuzz")
    except LdCacheError:
        return
    assert all(isinstance(e.key, str) for e in entries)


NAMES = st.text(alphabet="lib.so-_x0123456789\x7f\xe9", max_size=12)


@settings(max_examples=500, deadline=None)
@given(st.lists(NAMES, min_size=2, max_size=6))
def test_sort_agrees_with_libcmp(names):
    """Both sort keys (bytes, and the exact tuple when a DEL forces it) order as libcmp."""
    ordered = ldcache.sort_entries([ldcache.Entry(n, "/x") for n in names])
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert libcmp(a.key, b.key) >= 0


def triples(entries):
    return [(e.key, e.value, e.flags) for e in entries]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NAMES, st.sampled_from([ldcache.FLAGS_X86_64, ldcache.FLAGS_I386])), max_size=12),
       st.lists(st.tuples(NAMES, st.sampled_from([ldcache.FLAGS_X86_64, ldcache.FLAGS_I386])), max_size=5))
def test_extend_equals_a_full_merge(base, added):
    """The fast path (binary search into the image's sorted entries, its string table reused)
    gives exactly what parsing, merging, sorting and building everything gives."""
    base_entries = list({(k, f): ldcache.Entry(k, f"/img/{k}", f) for k, f in base}.values())
    ours = [ldcache.Entry(k, f"/ours/{k}/{i}", f) for i, (k, f) in enumerate(added)]  # repeats: the first wins
    image = ldcache.build(base_entries)
    fast = ldcache.parse(ldcache.extend(image, ours))
    slow = ldcache.parse(ldcache.build(ldcache.merge(ldcache.parse(image), ours)))
    assert triples(fast) == triples(slow)


def test_extend_real_caches_matches_ldconfig(tmp_path, driver_root):
    """The host's cache extended with the driver's entries: ldconfig lists exactly both, in order."""
    ours = [ldcache.Entry(e.key, "/usr/lib/x86_64-linux-gnu/" + e.key, e.flags)
            for e in ldcache.read(str(driver_root / "etc/ld.so.cache"))]
    host = ldcache.read("/etc/ld.so.cache")
    out = tmp_path / "ld.so.cache"
    out.write_bytes(ldcache.extend((open("/etc/ld.so.cache", "rb").read()), ours))
    got = ldconfig_p(out)
    expected = {(e.key, e.is_64bit, e.value) for e in ldcache.merge(host, ours)}
    assert sorted(got) == sorted(expected) and ours_order_ok(got)


def ours_order_ok(rows):
    return all(libcmp(a[0], b[0]) >= 0 for a, b in zip(rows, rows[1:], strict=False))


def test_extend_rejects_offsets_outside_the_table(driver_root):
    data = bytearray((driver_root / "etc/ld.so.cache").read_bytes())
    data[48 + 4:48 + 8] = (10**6).to_bytes(4, "little")
    with pytest.raises(LdCacheError, match="outside the string table"):
        ldcache.extend(bytes(data), [ldcache.Entry("libx.so.1", "/x")])
