"""Device rules as a cgroup v2 eBPF program (BPF_PROG_TYPE_CGROUP_DEVICE), the way runc
emulates the v1 devices controller there: the rules in order, the last one that matches a
request decides, and a request no rule matches is denied. Pure: rules in, instructions
out; gofer/cgroups/v2.py loads and attaches them.

The kernel calls the program with r1 = struct bpf_cgroup_dev_ctx {u32 access_type (access
<< 16 | type); u32 major; u32 minor}; it returns 1 to allow, 0 to deny. The registers:

    r2 type (1 block, 2 char)   r3 access (1 mknod, 2 read, 4 write)
    r4 major                    r5 minor       r0 scratch, then the verdict

r1 is never written, so allow_first() can put our blocks in front of another runtime's
program (the hook on a v2 host) and fall through into it unchanged.
"""

from __future__ import annotations

import struct
from collections import namedtuple

TYPES = {"b": 1, "c": 2}
ACCESS = {"m": 1, "r": 2, "w": 4}

_LDX_W, _AND32_K, _RSH32_K, _MOV32_X = 0x61, 0x54, 0x74, 0xBC
_JNE32_K, _JEQ32_K, _MOV64_K, _EXIT = 0x56, 0x16, 0xB7, 0x95


class Rule(namedtuple("Rule", "allow type major minor access", defaults=("a", None, None, "rwm"))):
    """One line of the v1 controller's language: ``c 195:* rwm`` allowed or denied: ``allow``,
    ``type`` a (both), b or c, ``major`` and ``minor`` (None: any), ``access``. (collections'
    namedtuple, not typing's: typing and re are 6 ms of every verb that touches a cgroup.)"""

    __slots__ = ()

    def line(self) -> str:
        def num(n: int | None) -> str:
            return "*" if n is None else str(n)
        return f"{self.type} {num(self.major)}:{num(self.minor)} {self.access}"


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm - (1 << 32) if imm >= 1 << 31 else imm)


PROLOGUE = b"".join((
    _insn(_LDX_W, 2, 1, 0), _insn(_AND32_K, 2, imm=0xFFFF),  # r2 = type
    _insn(_LDX_W, 3, 1, 0), _insn(_RSH32_K, 3, imm=16),  # r3 = access
    _insn(_LDX_W, 4, 1, 4), _insn(_LDX_W, 5, 1, 8),  # r4 = major, r5 = minor
))


def _block(rule: Rule) -> tuple[bytes, bool]:
    """The instructions of one rule, and whether it matches every request (nothing after an
    unconditional block could ever run, and the verifier refuses unreachable code).

    An allow rule matches a request that asks for nothing beyond its letters; a deny rule
    one that asks for any of them (v1's deny takes those letters away: `c 1:11 w` after
    `c 1:11 rwm` leaves read alone allowed, and an open for read and write denied)."""
    tests: list[tuple[int, int, int] | bytes] = []  # (jump op, register, value): on to the next block
    if rule.type in TYPES:
        tests.append((_JNE32_K, 2, TYPES[rule.type]))
    mask = sum(ACCESS[c] for c in set(rule.access))
    if mask != 7:
        if rule.allow:  # r3 & ~mask == 0, else on
            tests += [_insn(_MOV32_X, 0, 3), _insn(_AND32_K, 0, imm=~mask & 7), (_JNE32_K, 0, 0)]
        else:  # r3 & mask != 0, else on
            tests += [_insn(_MOV32_X, 0, 3), _insn(_AND32_K, 0, imm=mask), (_JEQ32_K, 0, 0)]
    if rule.major is not None:
        tests.append((_JNE32_K, 4, rule.major))
    if rule.minor is not None:
        tests.append((_JNE32_K, 5, rule.minor))
    n = len(tests) + 2
    out = b""
    for i, t in enumerate(tests):
        out += t if isinstance(t, bytes) else _insn(t[0], t[1], off=n - i - 1, imm=t[2])
    return out + _insn(_MOV64_K, 0, imm=int(rule.allow)) + _insn(_EXIT), not tests


def program(rules: list[Rule]) -> bytes:
    """The whole program for ``rules`` (last match wins, default deny)."""
    out = PROLOGUE
    for rule in reversed(rules):  # the first block that matches decides: the last rule first
        block, always = _block(rule)
        out += block
        if always:
            return out
    return out + _insn(_MOV64_K, 0, imm=0) + _insn(_EXIT)


def allow_first(rules: list[Rule], other: bytes) -> bytes:
    """``other`` (a whole program) with ``rules`` checked before it: a request one of them
    allows is allowed, anything else gets ``other``'s verdict. For adding the GPU nodes to
    the program another runtime attached to its container's cgroup."""
    out = PROLOGUE
    for rule in rules:
        block, always = _block(rule._replace(allow=True))
        out += block
        if always:
            return out
    return out + other
