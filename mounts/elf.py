"""What the plan needs from an ELF file: class, machine, SONAME, DT_NEEDED.

Two readers with one result. pyelftools is the general one (any class, byte order and
machine, and its own diagnostics). It costs ~0.65 ms a file, mostly building its construct
parsers per ELFFile, which alone would blow the 3 ms budget for a plan of ~25 libraries; so
little-endian files, the only kind the driver ships for x86-64 and aarch64, are read by a
~30 µs reader of the ELF header, the program headers and the PT_DYNAMIC segment with
``struct``. Section headers and the rest of the file are never touched either way. The tests
check that both readers agree on every file of the real driver.
"""

from __future__ import annotations

import struct

import msgspec

from mounts.errors import ElfError

DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME = 0, 1, 5, 14
PT_LOAD, PT_DYNAMIC = 1, 2
MACHINES = {3: "EM_386", 62: "EM_X86_64", 183: "EM_AARCH64"}

# (class, ehdr tail after e_ident, phdr, dyn) per ELF class, little-endian
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
        with open(path, "rb") as f:
            ident = f.read(16)
            if ident[:4] != b"\x7fELF":
                raise ElfError("not an ELF file (bad magic)")
            if ident[5] == 1 and ident[4] in _LAYOUT:
                return _read_le(f, ident[4])
            return read_elf_pyelftools(f)
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror}") from None
    except ElfError as e:
        raise ElfError(f"{path}: {e}") from None
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ElfError(f"{path}: truncated or malformed ELF file: {e}") from None


def _read_le(f, cls: int) -> ElfInfo:
    ehdr, phdr, dyn = _LAYOUT[cls]
    hdr = ehdr.unpack(f.read(ehdr.size))
    machine, phoff, phentsize, phnum = hdr[1], hdr[4], hdr[8], hdr[9]
    if phentsize != phdr.size:
        raise ElfError(f"unexpected program header size {phentsize}")
    f.seek(phoff)
    table = f.read(phnum * phentsize)
    if len(table) < phnum * phentsize:
        raise ElfError("truncated ELF file: program headers end past the end of the file")
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
        f.seek(dynamic[0])
        want = dynamic[1] - dynamic[1] % dyn.size
        data = f.read(want)
        if len(data) < want:
            raise ElfError("truncated ELF file: PT_DYNAMIC ends past the end of the file")
        for tag, val in dyn.iter_unpack(data):
            if tag == DT_NULL:
                break
            tags.append((tag, val))
    return _resolve(f, cls * 32, MACHINES.get(machine, str(machine)), tags, loads)


def _resolve(f, elfclass: int, machine: str, tags, loads) -> ElfInfo:
    strtab = next((v for t, v in tags if t == DT_STRTAB), None)
    soname, needed = None, []
    if strtab is not None:
        base = next((off + strtab - va for va, size, off in loads if va <= strtab < va + size), None)
        if base is None:
            raise ElfError("DT_STRTAB points outside every PT_LOAD segment")
        for tag, val in tags:
            if tag == DT_NEEDED:
                needed.append(_string(f, base + val))
            elif tag == DT_SONAME:
                soname = _string(f, base + val)
    return ElfInfo(elfclass, machine, soname, tuple(needed))


def _string(f, offset: int) -> str:
    f.seek(offset)
    chunk = f.read(256)
    end = chunk.find(b"\0")
    if end < 0:
        raise ElfError(f"unterminated dynamic string at offset {offset}")
    return chunk[:end].decode()


def read_elf_pyelftools(f) -> ElfInfo:
    """The general reader (any byte order): pyelftools' headers, the same PT_DYNAMIC walk."""
    from elftools.common.exceptions import ELFError
    from elftools.common.utils import struct_parse
    from elftools.construct import ConstructError
    from elftools.elf.elffile import ELFFile

    try:
        f.seek(0)
        elf = ELFFile(f)
        structs = elf.structs
        loads, tags = [], []
        for i in range(elf["e_phnum"]):
            ph = struct_parse(structs.Elf_Phdr, f, elf["e_phoff"] + i * elf["e_phentsize"])
            if ph.p_type == "PT_LOAD":
                loads.append((ph.p_vaddr, ph.p_filesz, ph.p_offset))
            elif ph.p_type == "PT_DYNAMIC":
                size = structs.Elf_Dyn.sizeof()
                for j in range(ph.p_filesz // size):
                    d = struct_parse(structs.Elf_Dyn, f, ph.p_offset + j * size)
                    if d.d_tag == "DT_NULL":
                        break
                    code = {"DT_NEEDED": DT_NEEDED, "DT_STRTAB": DT_STRTAB, "DT_SONAME": DT_SONAME}
                    if d.d_tag in code:
                        tags.append((code[d.d_tag], d.d_val))
        return _resolve(f, elf.elfclass, elf["e_machine"], tags, loads)
    except (ELFError, ConstructError) as e:
        raise ElfError(f"truncated or malformed ELF file: {e}") from None
