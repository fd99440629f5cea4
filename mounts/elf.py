"""What the plan needs from an ELF file: class, machine, SONAME, DT_NEEDED.

Two readers with one result. pyelftools is the general one (any class, byte order and
machine, and its own diagnostics). It costs ~0.65 ms a file, mostly building its construct
parsers per ELFFile, which alone would blow the 3 ms budget for a plan of ~25 libraries; so
little-endian files, the only kind the driver ships for x86-64 and aarch64, are read by a
~15 us reader of the ELF header, the program headers and the PT_DYNAMIC segment with
``struct`` and three preads. Section headers and the rest of the file are never touched
either way. The tests check that both readers agree on every file of the real driver.
"""

from __future__ import annotations

import os
import struct

import msgspec

from mounts import reads
from mounts.errors import ElfError

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 1, 5, 10, 14
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
ET_EXEC, ET_DYN = 2, 3
MACHINES = {3: "EM_386", 62: "EM_X86_64", 183: "EM_AARCH64"}

# ehdr after e_ident, phdr, dyn; per ELF class, little-endian
_LAYOUT = {
    1: (struct.Struct("<HHIIIIIHHHHHH"), struct.Struct("<IIIIIIII"), struct.Struct("<iI")),
    2: (struct.Struct("<HHIQQQIHHHHHH"), struct.Struct("<IIQQQQQQ"), struct.Struct("<qQ")),
}


class ElfInfo(msgspec.Struct, frozen=True):
    elfclass: int  # 32 or 64
    machine: str  # pyelftools' name: EM_X86_64, EM_386, EM_AARCH64 ...
    soname: str | None
    needed: tuple[str, ...]


def read_elf(path: str) -> ElfInfo:
    """Read ``path``'s dynamic section. Raises ElfError naming the file if it is not usable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror}") from None
    try:
        size = reads.opened(path, fd).st_size
        head = os.pread(fd, 4096, 0)  # the ELF header and, nearly always, the program headers
        if head[:4] != b"\x7fELF":
            raise ElfError("not an ELF file (bad magic)")
        if len(head) > 16 and head[5] == 1 and head[4] in _LAYOUT:
            return _read_le(fd, head, head[4], size)
        with os.fdopen(os.dup(fd), "rb") as f:
            return read_elf_pyelftools(f)
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror}") from None
    except ElfError as e:
        raise ElfError(f"{path}: {e}") from None
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise ElfError(f"{path}: truncated or malformed ELF file: {e or type(e).__name__}") from None
    finally:
        os.close(fd)


def not_an_executable(head: bytes) -> str | None:
    """Why a file that begins with ``head`` (its first bytes, 4 KiB are plenty) is no ELF
    executable, or None when it is one: ET_EXEC, or ET_DYN with an interpreter (a PIE; a
    shared library has none). A shell wrapper says which interpreter it names."""
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].strip()[:60]
        return f"a script (#!{''.join(chr(c) if 32 <= c < 127 else '?' for c in line)})"
    if head[:4] != b"\x7fELF":
        return "not an ELF file"
    if len(head) < 64 or head[5] != 1 or head[4] not in _LAYOUT:  # the driver's are little-endian
        return "not a little-endian ELF file of 32 or 64 bits"
    ehdr, phdr, _dyn = _LAYOUT[head[4]]
    hdr = ehdr.unpack_from(head, 16)
    e_type, phoff, phentsize, phnum = hdr[0], hdr[4], hdr[8], hdr[9]
    if e_type == ET_EXEC:
        return None
    if e_type != ET_DYN:
        return f"an ELF file of type {e_type}, not an executable"
    if phentsize == phdr.size and phoff + phnum * phentsize <= len(head):
        if any(ph[0] == PT_INTERP for ph in phdr.iter_unpack(head[phoff:phoff + phnum * phentsize])):
            return None
        return "an ELF shared library, not an executable"
    return "an ELF file whose program headers lie past its first 4 KiB"


def _pread(fd: int, size: int, offset: int, head: bytes, what: str, fsize: int) -> bytes:
    """``size`` bytes at ``offset``; every offset and size comes from the file, so both are
    checked against the file's size before anything is read or allocated."""
    if size < 0 or offset < 0 or offset + size > fsize:
        raise ElfError(f"truncated or malformed ELF file: {what} ({size} bytes at {offset}) lies "
                       f"outside the file ({fsize} bytes)")
    if offset + size <= len(head):
        return head[offset:offset + size]
    data = os.pread(fd, size, offset)
    if len(data) < size:
        raise ElfError(f"truncated ELF file: {what} ends past the end of the file")
    return data


def _read_le(fd: int, head: bytes, cls: int, fsize: int) -> ElfInfo:
    ehdr, phdr, dyn = _LAYOUT[cls]
    hdr = ehdr.unpack_from(head, 16)
    machine, phoff, phentsize, phnum = hdr[1], hdr[4], hdr[8], hdr[9]
    if phentsize != phdr.size:
        raise ElfError(f"unexpected program header size {phentsize}")
    table = _pread(fd, phnum * phentsize, phoff, head, "program headers", fsize)
    loads, dynamic = [], None
    for ph in phdr.iter_unpack(table):
        if cls == 1:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
            p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[1], ph[2], ph[4]
        else:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, ...
            p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[2], ph[3], ph[5]
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    tags: list[tuple[int, int]] = []
    if dynamic is not None:
        data = _pread(fd, dynamic[1] - dynamic[1] % dyn.size, dynamic[0], head, "PT_DYNAMIC", fsize)
        words = memoryview(data).cast("q" if cls == 2 else "i").tolist()  # d_tag, d_val, ...
        kinds = words[0::2]
        end = kinds.index(DT_NULL) if DT_NULL in kinds else len(kinds)
        tags = list(zip(kinds[:end], words[1:2 * end:2], strict=True))
    return _resolve(lambda off, size: _pread(fd, size, off, head, "the dynamic string table", fsize),
                    cls * 32, MACHINES.get(machine, str(machine)), tags, loads)


def _resolve(read, elfclass: int, machine: str, tags, loads) -> ElfInfo:
    """SONAME and DT_NEEDED from the dynamic tags; ``read(offset, size)`` reads the file."""
    first = dict(reversed(tags))  # the first value of each tag
    strtab = first.get(DT_STRTAB)
    soname, needed = None, []
    if strtab is not None:
        base = next((off + strtab - va for va, size, off in loads if va <= strtab < va + size), None)
        if base is None:
            raise ElfError("DT_STRTAB points outside every PT_LOAD segment")
        size = first.get(DT_STRSZ, 0)
        if not 0 < size <= 1 << 24:
            raise ElfError(f"implausible DT_STRSZ {size}")
        table = read(base, size)
        for tag, val in tags:
            if tag in (DT_NEEDED, DT_SONAME):
                end = table.find(b"\0", val)
                if val >= size or end < 0:
                    raise ElfError(f"dynamic string at {val} is outside the string table ({size} bytes)")
                if tag == DT_NEEDED:
                    needed.append(table[val:end].decode())
                else:
                    soname = table[val:end].decode()
    return ElfInfo(elfclass, machine, soname, tuple(needed))


def read_elf_pyelftools(f) -> ElfInfo:
    """The general reader (any byte order): pyelftools' headers, the same PT_DYNAMIC walk."""
    from elftools.common.exceptions import ELFError
    from elftools.common.utils import struct_parse
    from elftools.construct import ConstructError
    from elftools.elf.elffile import ELFFile

    code = {"DT_NEEDED": DT_NEEDED, "DT_STRTAB": DT_STRTAB, "DT_STRSZ": DT_STRSZ, "DT_SONAME": DT_SONAME}
    try:
        fsize = os.fstat(f.fileno()).st_size
        f.seek(0)
        elf = ELFFile(f)
        structs = elf.structs
        loads, tags = [], []
        for i in range(elf["e_phnum"]):
            ph = struct_parse(structs.Elf_Phdr, f, elf["e_phoff"] + i * elf["e_phentsize"])
            if ph.p_type == "PT_LOAD":
                loads.append((ph.p_vaddr, ph.p_filesz, ph.p_offset))
            elif ph.p_type == "PT_DYNAMIC":
                if ph.p_offset + ph.p_filesz > fsize:
                    raise ElfError("truncated ELF file: PT_DYNAMIC ends past the end of the file")
                size = structs.Elf_Dyn.sizeof()
                for j in range(ph.p_filesz // size):
                    d = struct_parse(structs.Elf_Dyn, f, ph.p_offset + j * size)
                    if d.d_tag == "DT_NULL":
                        break
                    if d.d_tag in code:
                        tags.append((code[d.d_tag], d.d_val))

        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            data = f.read(size)
            if len(data) < size:
                raise ElfError("truncated ELF file: the dynamic string table ends past the end of the file")
            return data

        return _resolve(read, elf.elfclass, elf["e_machine"], tags, loads)
    except (ELFError, ConstructError, OSError) as e:  # OSError: offsets that seek nowhere
        raise ElfError(f"truncated or malformed ELF file: {e}") from None
