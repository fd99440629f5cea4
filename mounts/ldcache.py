"""glibc's ld.so.cache: read (old ``ld.so-1.7.0`` and new ``glibc-ld.so.cache1.1``) and write.

Layout of the new format (all little-endian on the machines we serve)::

    header  magic[17] "glibc-ld.so.cache", version[3] "1.1",
            u32 nlibs, u32 len_strings, u8 flags, u8 pad[3], u32 extension_offset, u32 unused[3]
    entries nlibs x {i32 flags; u32 key; u32 value; u32 osversion; u64 hwcap}
    strings NUL-terminated; key/value are offsets from the start of this header

The old format (``ld.so-1.7.0``, u32 nlibs, nlibs x {i32 flags; u32 key; u32 value}) may come
first; then the new header follows at the next 8-byte boundary. Every offset read from a file
is untrusted and checked against the file's size.

glibc's loader binary-searches the entries with _dl_cache_libcmp (digit runs compare as
numbers), so the writer sorts them exactly as ldconfig does: descending by that order (here a
sort key, ``libcmp_key``), then by flags. The tests hold the key against a transcription of
libcmp itself.
"""

from __future__ import annotations

import re
import struct

import msgspec

from mounts.errors import LdCacheError

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
HWCAP_EXTENSION = 1 << 62

FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
FLAG_X8664_LIB64 = 0x0300
FLAGS_X86_64 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
FLAGS_I386 = FLAG_ELF_LIBC6

_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext offset
_ENTRY = struct.Struct("<iIIIQ")
_OLD_ENTRY = struct.Struct("<iII")
ENDIAN_LITTLE = 2


class Entry(msgspec.Struct, frozen=True):
    """One cache entry: the name the loader looks up, the file it maps to, its type flags."""

    key: str
    value: str
    flags: int = FLAGS_X86_64
    hwcap: int = 0

    @property
    def is_64bit(self) -> bool:
        return self.flags & FLAG_REQUIRED_MASK != 0


def _cstr(data: bytes, offset: int, path: str) -> str:
    if not 0 <= offset < len(data):
        raise LdCacheError(f"{path}: string offset {offset} is outside the file ({len(data)} bytes)")
    end = data.find(b"\0", offset)
    if end < 0:
        raise LdCacheError(f"{path}: string at offset {offset} is not terminated")
    try:
        return data[offset:end].decode()
    except UnicodeDecodeError:
        raise LdCacheError(f"{path}: string at offset {offset} is not valid UTF-8") from None


def parse(data: bytes, path: str = "ld.so.cache") -> list[Entry]:
    """Entries of a cache image, in file order. Raises LdCacheError on any malformation."""
    base = _new_header(data, path)
    if base is None:
        (nold,) = struct.unpack_from("<I", data, 12)
        return _parse_old(data, nold, 16 + nold * _OLD_ENTRY.size, path)
    _magic, nlibs, _len_strings, _flags, _ext = _HEADER.unpack_from(data, base)
    first = base + _HEADER.size
    entries = []
    for flags, key, value, _osv, hwcap in _ENTRY.iter_unpack(data[first:first + nlibs * _ENTRY.size]):
        entries.append(Entry(_cstr(data, base + key, path), _cstr(data, base + value, path), flags, hwcap))
    return entries


def _parse_old(data: bytes, nlibs: int, strings: int, path: str) -> list[Entry]:
    entries = []
    for flags, key, value in _OLD_ENTRY.iter_unpack(data[16:16 + nlibs * _OLD_ENTRY.size]):
        entries.append(Entry(_cstr(data, strings + key, path), _cstr(data, strings + value, path), flags))
    return entries


def read(path: str) -> list[Entry]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LdCacheError(f"{path}: cannot read: {e.strerror}") from None
    return parse(data, path)


_RUN = re.compile(rb"([0-9]+)|[^0-9]+")
# Other bytes compare as glibc's (x86, signed) chars do: 0x80-0xff before ASCII. That maps
# them onto 0x00-0xfe, DEL aside, leaving 0xff to mark a digit run.
_SIGNED = bytes(b ^ 0x80 for b in range(256))


def _run(m: re.Match) -> bytes:
    if m.group(1) is None:
        return m.group().translate(_SIGNED)
    digits = m.group().lstrip(b"0")
    return b"\xff" + bytes((len(digits),)) + digits


def libcmp_key(name: str | bytes) -> bytes | None:
    """A bytes key that orders names as glibc's libcmp does: a digit run becomes 0xff, its length and
    its digits (so runs compare by value, and after any other byte); other bytes compare
    signed. None for the names it cannot encode (with DEL, or over 255 bytes)."""
    raw = name.encode() if isinstance(name, str) else name
    if b"\x7f" in raw or len(raw) > 255:
        return None
    return _RUN.sub(_run, raw) + b"\x80"  # the NUL terminator: a signed 0 sorts above 0x80-0xff


def _exact_key(name: str) -> tuple:
    """The same order for any name, slower: digit runs (1, value), other bytes (0, signed)."""
    return tuple((1, int(r)) if r[:1].isdigit() else (0, r[0] - 256 if r[0] > 127 else r[0])
                 for r in re.findall(rb"[0-9]+|[^0-9]", name.encode())) + ((0, 0),)


def sort_entries(entries: list[Entry]) -> list[Entry]:
    """The order ldconfig writes and the loader's binary search expects: descending by
    libcmp, then by flags (stable for full ties, as ldconfig's qsort of unique keys)."""
    keys: list[bytes | tuple | None] = [libcmp_key(e.key) for e in entries]
    if None in keys:
        keys = [_exact_key(e.key) for e in entries]
    order = sorted(range(len(entries)), key=lambda i: (keys[i], entries[i].flags), reverse=True)
    return [entries[i] for i in order]


def build(entries: list[Entry]) -> bytes:
    """A new-format cache image of ``entries`` (sorted here; hwcap extensions not written)."""
    entries = sort_entries(entries)
    strings = bytearray()
    offsets: dict[str, int] = {}
    table_start = _HEADER.size + len(entries) * _ENTRY.size

    def intern(s: str) -> int:
        if s not in offsets:
            offsets[s] = table_start + len(strings)
            strings.extend(s.encode() + b"\0")
        return offsets[s]

    packed = [_ENTRY.pack(e.flags, intern(e.key), intern(e.value), 0, e.hwcap & ~HWCAP_EXTENSION)
              for e in entries]
    header = _HEADER.pack(NEW_MAGIC, len(entries), len(strings), ENDIAN_LITTLE, 0)
    return header + b"".join(packed) + bytes(strings)


def unique(added: list[Entry]) -> list[Entry]:
    """Ours, each (key, flags) once: the first, which the loader would take."""
    seen: dict[tuple[str, int], Entry] = {}
    for e in added:
        seen.setdefault((e.key, e.flags), e)
    return list(seen.values())


def merge(base: list[Entry], added: list[Entry]) -> list[Entry]:
    """The image's own entries plus ours; ours replace any image entry with the same key and flags."""
    added = unique(added)
    ours = {(e.key, e.flags) for e in added}
    return [e for e in base if (e.key, e.flags) not in ours and not e.hwcap & HWCAP_EXTENSION] + added


def extend(data: bytes, added: list[Entry], path: str = "ld.so.cache") -> bytes:
    """The image's cache ``data`` plus ``added`` (replacing entries of the same key and flags),
    as a new cache image, without parsing or re-sorting the image's entries.

    The image's entries are taken to be in ldconfig's order, as every ldconfig writes them
    and the loader's binary search needs: ours are placed by binary search (O(m log n) name
    comparisons instead of O(n) keys for a full sort) and the image's string table is reused
    as it is, after checking that every offset points inside it. Were the image's order
    wrong, the loader would miss our names as it already misses its own, and fall back to its
    default paths. Raises LdCacheError for a malformed image (the caller then starts afresh);
    an old-format-only cache, or a name libcmp_key cannot encode, takes the slow exact path."""
    base = _new_header(data, path)
    if base is None:
        return build(merge(parse(data, path), added))
    _magic, nlibs, len_strings, _flags, _ext = _HEADER.unpack_from(data, base)
    first = base + _HEADER.size
    table = first + nlibs * _ENTRY.size
    end = table + len_strings
    if end > len(data) or (len_strings and data[end - 1] != 0):
        raise LdCacheError(f"{path}: the string table ({len_strings} bytes) does not end inside the file")
    lo_off, hi_off = table - base, end - base
    rows = [r for r in _ENTRY.iter_unpack(data[first:table]) if not r[4] & HWCAP_EXTENSION]
    if not all(lo_off <= r[1] < hi_off and lo_off <= r[2] < hi_off for r in rows):
        raise LdCacheError(f"{path}: an entry points outside the string table")

    def name(r) -> bytes:
        return data[base + r[1]:data.index(b"\0", base + r[1])]

    keys: dict[int, bytes | None] = {}  # by key offset: computed only where the search looks

    def key(i: int):
        r = items[i]
        if isinstance(r, Entry):
            return libcmp_key(r.key), r.flags
        if r[1] not in keys:
            keys[r[1]] = libcmp_key(name(r))
        return keys[r[1]], r[0]

    items: list = rows
    for e in sort_entries(unique(added)):
        want = (libcmp_key(e.key), e.flags)
        lo, hi = 0, len(items)
        while lo < hi:  # first item not greater than ours, in descending order
            mid = (lo + hi) // 2
            k = key(mid)
            if k[0] is None or want[0] is None:
                return build(merge(parse(data, path), added))
            if k > want:
                lo = mid + 1
            else:
                hi = mid
        stop = lo
        while stop < len(items) and key(stop) == want:  # names libcmp holds equal ("0", "00")
            stop += 1
        same = [i for i in range(lo, stop) if _name_of(items[i], name) == e.key]  # exactly ours: replaced
        for i in reversed(same):
            del items[i]
        items.insert(stop - len(same), e)  # after the equal ones, as the stable full sort puts it

    strings = bytearray()
    head = _HEADER.size + len(items) * _ENTRY.size
    ours_at = head + len_strings
    packed = []
    for r in items:
        if isinstance(r, Entry):
            k = ours_at + len(strings)
            strings += r.key.encode() + b"\0"
            v = ours_at + len(strings)
            strings += r.value.encode() + b"\0"
            packed.append(_ENTRY.pack(r.flags, k, v, 0, 0))
        else:
            packed.append(_ENTRY.pack(r[0], head + r[1] - lo_off, head + r[2] - lo_off, r[3], r[4]))
    header = _HEADER.pack(NEW_MAGIC, len(items), len_strings + len(strings), ENDIAN_LITTLE, 0)
    return header + b"".join(packed) + data[table:end] + bytes(strings)


def _name_of(item, name) -> str:
    """The key of an image row (through ``name``) or of one of our Entries."""
    return item.key if isinstance(item, Entry) else name(item).decode("utf-8", "surrogateescape")


def _new_header(data: bytes, path: str) -> int | None:
    """Offset of the new-format header (after an old-format block if any), None if the
    cache has only the old format."""
    base = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            raise LdCacheError(f"{path}: truncated old-format header")
        (nold,) = struct.unpack_from("<I", data, 12)
        old_end = 16 + nold * _OLD_ENTRY.size
        if old_end > len(data):
            raise LdCacheError(f"{path}: {nold} old-format entries do not fit in {len(data)} bytes")
        base = (old_end + 7) & ~7
        if not data.startswith(NEW_MAGIC, base):
            return None
    if not data.startswith(NEW_MAGIC, base):
        raise LdCacheError(f"{path}: not an ld.so.cache (bad magic)")
    if len(data) < base + _HEADER.size:
        raise LdCacheError(f"{path}: truncated header")
    _magic, nlibs, _len, _flags, _ext = _HEADER.unpack_from(data, base)
    if base + _HEADER.size + nlibs * _ENTRY.size > len(data):
        raise LdCacheError(f"{path}: {nlibs} entries do not fit in {len(data)} bytes")
    return base
