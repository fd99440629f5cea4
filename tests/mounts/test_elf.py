import os

import pytest

from mounts.elf import ElfInfo, read_elf, read_elf_pyelftools
from mounts.errors import ElfError


def driver_files(root):
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if ".so" in name and not os.path.islink(path):
                yield path


def test_fast_reader_agrees_with_pyelftools(driver_root, rootfs_debian):
    paths = list(driver_files(driver_root / "usr/lib")) + list(driver_files(rootfs_debian / "usr/lib"))
    assert len(paths) > 25
    for path in paths:
        with open(path, "rb") as f:
            assert read_elf(path) == read_elf_pyelftools(f), path


def test_soname_and_needed(driver_root, driver_version):
    info = read_elf(str(driver_root / f"usr/lib/x86_64-linux-gnu/nvidia/current/libGLX_nvidia.so.{driver_version}"))
    assert info.soname == "libGLX_nvidia.so.0"
    assert f"libnvidia-glcore.so.{driver_version}" in info.needed
    assert info.elfclass == 64 and info.machine == "EM_X86_64"


def test_truncated_files_give_clear_errors(tmp_path, driver_root, driver_version):
    data = (driver_root / f"usr/lib/x86_64-linux-gnu/libnvidia-tls.so.{driver_version}").read_bytes()
    cut = tmp_path / "cut.so"
    for n in (0, 3, 10, 20, 63, 64, 100, 500):
        cut.write_bytes(data[:n])
        with pytest.raises(ElfError, match=str(cut)):
            read_elf(str(cut))


def test_not_elf_and_missing(tmp_path):
    p = tmp_path / "text.so"
    p.write_text("hello")
    with pytest.raises(ElfError, match="bad magic"):
        read_elf(str(p))
    with pytest.raises(ElfError, match="cannot read"):
        read_elf(str(tmp_path / "missing.so"))


def test_other_byte_orders_go_to_pyelftools(tmp_path):
    """Only little-endian files take the fast path: a big-endian ELF (here a bare ppc64
    header, no program headers) is read by pyelftools."""
    import struct

    header = b"\x7fELF" + bytes([2, 2, 1, 0]) + bytes(8) + struct.pack(
        ">HHIQQQIHHHHHH", 3, 21, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0)
    p = tmp_path / "be.so"
    p.write_bytes(header)
    assert read_elf(str(p)) == ElfInfo(64, "EM_PPC64", None, ())


def test_what_is_an_executable(tmp_path, driver_root, driver_version, rootfs_debian):
    """The driver's binaries are ET_EXEC; a PIE (ET_DYN with an interpreter, as Debian builds
    its own) is one too; a shared library, a wrapper script or anything else is not."""
    from mounts.elf import not_an_executable

    def head(path):
        with open(path, "rb") as f:
            return f.read(4096)

    assert not_an_executable(head(driver_root / "usr/lib/nvidia/current/nvidia-smi")) is None
    assert not_an_executable(head(rootfs_debian / "usr/bin/cudacheck")) is None  # gcc's default: a PIE
    lib = driver_root / f"usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{driver_version}"
    assert not_an_executable(head(lib)) == "an ELF shared library, not an executable"
    assert not_an_executable(b"#!/bin/bash\nexec /usr/local/nvidia/bin/nvidia-smi\n") == "a script (#!/bin/bash)"
    assert not_an_executable(b"#! /bin/sh -e\x1b[31m\n") == "a script (#!/bin/sh -e?[31m)"  # nothing raw reaches a terminal
    assert not_an_executable(b"\x7fELF") == "not a little-endian ELF file of 32 or 64 bits"
    assert not_an_executable(b"MZ\x90\x00") == "not an ELF file"
    assert not_an_executable(b"") == "not an ELF file"
