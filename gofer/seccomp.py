"""linux.seccomp, compiled with libseccomp as runc does it: the default action, the
architectures, every rule with its action, errno and argument comparisons, and the flags.

Syscall names that libseccomp or this kernel's architecture does not know are skipped (a
profile names syscalls of every kernel); a rule whose action is the default is skipped (it
would change nothing, and libseccomp refuses it). Comparisons on the same argument cannot be
ANDed by the kernel's filter: such a rule becomes one rule per comparison, as runc makes it.

SCMP_ACT_NOTIFY: once the filter is loaded, its notification fd goes to the agent listening
at ``listenerPath`` (connected while the host's paths are visible), with the runtime spec's
container process state: ``{"ociVersion", "fds": ["seccompFd"], "pid", "metadata", "state"}``.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

import msgspec

from gofer import syscalls as sc
from mounts.errors import SandboxError
from mounts.spec import OCI_VERSION, Seccomp

FLAGS = {"SECCOMP_FILTER_FLAG_TSYNC": sc.SCMP_FLTATR_CTL_TSYNC, "SECCOMP_FILTER_FLAG_LOG": sc.SCMP_FLTATR_CTL_LOG,
         "SECCOMP_FILTER_FLAG_SPEC_ALLOW": sc.SCMP_FLTATR_CTL_SSB}


def action(name: str, errno_ret: int | None) -> int:
    code = sc.SCMP_ACT[name]
    if name in ("SCMP_ACT_ERRNO", "SCMP_ACT_TRACE"):
        code |= (errno.EPERM if errno_ret is None else errno_ret) & 0xFFFF
    return code


def connect_listener(spec: Seccomp) -> socket.socket | None:
    """The agent at ``listenerPath``, connected while the host's paths are visible, or None."""
    if not spec.listener_path:
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.connect(spec.listener_path)
    except OSError as e:
        listener.close()
        raise SandboxError(f"linux.seccomp.listenerPath {spec.listener_path}: cannot connect: {e.strerror}",
                           op="connect", path=spec.listener_path) from None
    return listener


def listener_message(spec: Seccomp, pid: int, state: dict) -> bytes:
    """What the agent gets with the notification fd: the runtime spec's container process state."""
    return msgspec.json.encode({"pid": pid, "ociVersion": OCI_VERSION, "fds": ["seccompFd"],  # (pid first:
                                "metadata": spec.listener_metadata or "", "state": state})  # frontend_plan)


CACHE: str | None = None  # the warm server's directory of exported filters (sandbox/server/listen.py), root's alone
MAX_CACHED = 256  # filters kept at most: past that, each is compiled as without a cache


def export(spec: Seccomp) -> bytes:
    """``spec`` compiled and exported as BPF (struct sock_filter[]) for a process that loads
    it itself (sandbox/executor/frontend.c). With CACHE set, a filter exported before is read back: an
    engine gives every container one default profile, and its compiling was ~7 ms of each
    served create and exec here, 30 under load. The key is the profile as encoded (each
    server has a directory of its own: its code and libseccomp are the same throughout); a
    file that is not root's alone, one name, whole instructions is not used, nor is the
    cache at all where a directory on its way from / is not root's alone (mounts/trusted.py):
    its owner could rename our files, written into a directory of theirs, into each other's
    names."""
    if CACHE is None:
        return compile_filter(spec).export_bpf()
    import hashlib

    from mounts.atomic import replace_whole
    from mounts.trusted import open_root_only

    key = hashlib.sha256(msgspec.json.encode(spec)).hexdigest()
    try:  # its way from / again at each use: a directory on it another user's, and the files are theirs to swap
        cache = open_root_only(CACHE, "seccomp filter cache", "a filter planted there would be a container's")
    except (OSError, SandboxError):
        return compile_filter(spec).export_bpf()
    try:
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=cache)
        except FileNotFoundError:
            pass
        except OSError:  # (a link, or worse: nothing of ours)
            return compile_filter(spec).export_bpf()
        else:
            with open(fd, "rb") as f:
                st = os.fstat(fd)
                bpf = f.read(MAX_BPF + 1)
            ours = stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_nlink == 1 and not st.st_mode & 0o077
            if ours and 0 < len(bpf) <= MAX_BPF and len(bpf) % 8 == 0:
                return bpf
        bpf = compile_filter(spec).export_bpf()
        try:
            if len(os.listdir(cache)) < MAX_CACHED:
                replace_whole(key, bpf, 0o600, dir_fd=cache)
        except OSError:
            pass  # (a full /run: compiled each time, as without a cache)
        return bpf
    finally:
        os.close(cache)


MAX_BPF = 4096 * 8  # BPF_MAXINSNS instructions of 8 bytes


def compile_filter(spec: Seccomp) -> sc.Seccomp:
    """The filter, ready to load or export. Errors name the field (one line)."""
    try:
        default = action(spec.default_action, spec.default_errno_ret)
        filt = sc.Seccomp(default)
        # the spec's flags, and never libseccomp's own no_new_privs: the spec decides that
        filt.set_attr(sc.SCMP_FLTATR_CTL_NNP, 0)
        for flag in spec.flags:
            filt.set_attr(FLAGS[flag], 1)
        for arch in spec.architectures:
            if not filt.add_arch(arch.lower().removeprefix("scmp_arch_")):
                raise SandboxError(f"linux.seccomp.architectures: {arch!r} is not known to this libseccomp",
                                   code=2)
        for i, rule in enumerate(spec.syscalls):
            act = action(rule.action, rule.errno_ret)
            if act == default:
                continue
            args = [(a.index, sc.SCMP_CMP[a.op], a.value, a.value_two) for a in rule.args or ()]
            indices = [a[0] for a in args]
            groups = [[a] for a in args] if len(set(indices)) != len(indices) else [args]
            for name in rule.names:
                nr = filt.syscall(name)
                if nr is None:
                    continue
                for group in groups:
                    filt.add_rule(act, nr, group, f"linux.seccomp.syscalls[{i}] {name}")
        return filt
    except OSError as e:
        raise SandboxError(f"linux.seccomp: {e}", op="seccomp", path="linux.seccomp") from None
