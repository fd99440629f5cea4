"""An OCI bundle read and validated: ``config.json`` decoded into mounts/spec.py's Structs,
then one list of small checks (runc's ``configs/validate`` and what its ``specconv``
refuses, plus our own), all before anything forks. Every failure is a BundleError (exit 2)
of one line naming the file and the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import msgspec

from mounts.errors import BundleError
from mounts.spec import (
    CAP_NUMBERS,
    HOST_NAME_MAX,
    IOPRIO_CLASSES,
    MEMORY_LIMIT_MIN,
    NAMESPACE_TYPES,
    NGROUPS_MAX,
    PERSONALITY_DOMAINS,
    PROPAGATIONS,
    RLIM_MAX,
    RLIMITS,
    SCHED_FLAGS,
    SCHED_POLICIES,
    SECCOMP_ACTIONS,
    SECCOMP_FLAGS,
    SECCOMP_OPS,
    SYSCTL_NAMESPACES,
    UINT32_MAX,
    Capabilities,
    Hooks,
    Process,
    Resources,
    Spec,
    sysctl_name,
)

MAX_CONFIG = 32 << 20  # bytes of config.json: what the gofer's wire carries with room to spare

# libseccomp's names (runc 1.1's sixteen, and the newer ones libseccomp 2.5 knows)
SECCOMP_ARCHES = frozenset(
    "x86 x86_64 x32 arm aarch64 mips mips64 mips64n32 mipsel mipsel64 mipsel64n32 ppc ppc64 ppc64le "
    "s390 s390x parisc parisc64 riscv64 loongarch64".split())


class Invalid(Exception):
    """A check's finding: the field (as the spec spells it) and what is wrong with it."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")


def _range(value: int, lo: int, hi: int, field: str) -> None:
    if not lo <= value <= hi:
        raise Invalid(field, f"{value} is out of range ({lo}..{hi})")


def _version(spec: Spec) -> None:
    """1.MINOR.PATCH, with a pre-release tag if any (1.0.2-dev): what engines write."""
    v = spec.oci_version
    core, _, tag = v.partition("-")
    parts = core.split(".")
    if not (len(parts) == 3 and parts[0] == "1" and all(p.isascii() and p.isdigit() for p in parts)
            and (not tag or tag.replace(".", "").replace("-", "").isalnum())):
        raise Invalid("ociVersion", f"{v!r} is not a version 1.x.y of the runtime spec")


def _env(env: list[str], field: str) -> None:
    """NAME=VALUE, NAME not empty (runc refuses the others: 'invalid environment variable')."""
    for i, item in enumerate(env):
        name, eq, _ = item.partition("=")
        if not eq or not name:
            raise Invalid(f"{field}[{i}]", f"{item[:64]!r} is not NAME=VALUE")


def _process(spec: Spec) -> None:
    """The process's own fields (also what exec --process gives): cwd (runc's rules), ids
    as uint32, capabilities and rlimits by name, ranges the kernel takes."""
    proc = spec.process
    if proc is None:
        return
    if proc.args and not proc.args[0]:  # (execve refuses it; runc finds no such executable)
        raise Invalid("process.args[0]", "must not be empty")
    if not proc.cwd:
        raise Invalid("process.cwd", "must not be empty")
    if not proc.cwd.startswith("/"):
        raise Invalid("process.cwd", f"{proc.cwd!r} is not an absolute path")
    _env(proc.env, "process.env")
    _range(proc.user.uid, 0, UINT32_MAX, "process.user.uid")
    _range(proc.user.gid, 0, UINT32_MAX, "process.user.gid")
    if len(proc.user.additional_gids) > NGROUPS_MAX:
        raise Invalid("process.user.additionalGids", f"{len(proc.user.additional_gids)} groups is over the "
                      f"kernel's limit of {NGROUPS_MAX} (NGROUPS_MAX)")
    for i, gid in enumerate(proc.user.additional_gids):
        _range(gid, 0, UINT32_MAX, f"process.user.additionalGids[{i}]")
    if proc.user.umask is not None:
        _range(proc.user.umask, 0, 0o7777, "process.user.umask")
    if proc.capabilities is not None:
        for field in Capabilities.__struct_fields__:
            for name in getattr(proc.capabilities, field):
                if name.upper() not in CAP_NUMBERS:
                    raise Invalid(f"process.capabilities.{field}", f"unknown capability {name!r}")
    for i, rl in enumerate(proc.rlimits):
        if rl.type not in RLIMITS:
            raise Invalid(f"process.rlimits[{i}].type", f"unknown limit {rl.type!r}")
        _range(rl.soft, 0, RLIM_MAX, f"process.rlimits[{i}].soft")
        _range(rl.hard, 0, RLIM_MAX, f"process.rlimits[{i}].hard")
        if rl.soft > rl.hard:  # (setrlimit(2): EINVAL)
            raise Invalid(f"process.rlimits[{i}]", f"{rl.type} soft {rl.soft} is above hard {rl.hard}")
    if proc.oom_score_adj is not None:
        _range(proc.oom_score_adj, -1000, 1000, "process.oomScoreAdj")
    if proc.io_priority is not None:
        if proc.io_priority.class_ not in IOPRIO_CLASSES:
            raise Invalid("process.ioPriority.class", f"{proc.io_priority.class_!r} is not one of "
                          f"{', '.join(IOPRIO_CLASSES)}")
        _range(proc.io_priority.priority, 0, 7, "process.ioPriority.priority")


def _scheduler(spec: Spec) -> None:
    sched = spec.process.scheduler if spec.process else None
    if sched is None:
        return
    if sched.policy not in SCHED_POLICIES:
        raise Invalid("process.scheduler.policy", f"{sched.policy!r} is not one of {', '.join(SCHED_POLICIES)}")
    for flag in sched.flags:
        if flag not in SCHED_FLAGS:
            raise Invalid("process.scheduler.flags", f"unknown flag {flag!r}")
    _range(sched.nice, -20, 19, "process.scheduler.nice")
    _range(sched.priority, 0, 99, "process.scheduler.priority")
    for name in ("runtime", "deadline", "period"):
        _range(getattr(sched, name), 0, (1 << 64) - 1, f"process.scheduler.{name}")
    if (sched.policy == "SCHED_DEADLINE" and "SCHED_FLAG_RESET_ON_FORK" not in sched.flags
            and spec.hooks is not None and spec.hooks.start_container):
        # the hooks run in the container's process, which holds the policy by then
        raise Invalid("process.scheduler", "a SCHED_DEADLINE task cannot fork to run hooks.startContainer "
                      "(add SCHED_FLAG_RESET_ON_FORK)")


def _namespaces(spec: Spec) -> None:
    """Known types, each at most once (runc's specconv)."""
    seen: set[str] = set()
    for i, ns in enumerate(spec.linux.namespaces):
        if ns.type not in NAMESPACE_TYPES:
            raise Invalid(f"linux.namespaces[{i}].type", f"unknown namespace type {ns.type!r} (one of "
                          f"{', '.join(NAMESPACE_TYPES)})")
        if ns.type in seen:
            raise Invalid(f"linux.namespaces[{i}]", f"the {ns.type} namespace is named twice")
        seen.add(ns.type)


def _hostname(spec: Spec) -> None:
    if spec.hostname and not any(ns.type == "uts" for ns in spec.linux.namespaces):
        raise Invalid("hostname", "cannot be set without a UTS namespace in linux.namespaces")
    if spec.hostname and len(spec.hostname.encode()) > HOST_NAME_MAX:
        raise Invalid("hostname", f"{len(spec.hostname.encode())} bytes is over the kernel's limit of "
                      f"{HOST_NAME_MAX}")


_HOOK_FIELDS = tuple((f.name, f.encode_name) for f in msgspec.structs.fields(Hooks))


def _hooks(spec: Spec) -> None:
    """An absolute path (the runtime spec's rule; runc fails to exec any other) and NAME=VALUE
    variables, as the process's."""
    for name, camel in _HOOK_FIELDS if spec.hooks is not None else ():
        for i, hook in enumerate(getattr(spec.hooks, name)):
            if not hook.path.startswith("/"):
                raise Invalid(f"hooks.{camel}[{i}].path", f"{hook.path!r} is not an absolute path")
            _env(hook.env, f"hooks.{camel}[{i}].env")


def _user_namespace(spec: Spec) -> None:
    """Mappings go with a new user namespace, and it needs them (runc's rules); the
    container's root must be mapped (it becomes root in there to build the container)."""
    user = next((ns for ns in spec.linux.namespaces if ns.type == "user"), None)
    maps = (("uidMappings", spec.linux.uid_mappings), ("gidMappings", spec.linux.gid_mappings))
    for field, mapping in maps:
        for i, m in enumerate(mapping):
            for name, camel in (("container_id", "containerID"), ("host_id", "hostID"), ("size", "size")):
                _range(getattr(m, name), 1 if name == "size" else 0, UINT32_MAX, f"linux.{field}[{i}].{camel}")
        if user is None and mapping:
            raise Invalid(f"linux.{field}", "mappings without a user namespace in linux.namespaces")
        if user is not None and not user.path:
            if not mapping:
                raise Invalid(f"linux.{field}", "a new user namespace needs mappings")
            if not any(m.container_id == 0 for m in mapping):
                raise Invalid(f"linux.{field}", "the container's root (0) is not mapped")


def _unsupported(spec: Spec) -> None:
    if spec.linux.intel_rdt is not None:
        raise Invalid("linux.intelRdt", "Intel RDT (resctrl) is not supported")
    pers = spec.linux.personality
    if pers is not None:
        if pers.domain not in PERSONALITY_DOMAINS:
            raise Invalid("linux.personality.domain", f"{pers.domain!r} is not LINUX or LINUX32")
        if pers.flags:  # the spec defines none yet (runc takes none)
            raise Invalid("linux.personality.flags", f"{pers.flags[0]!r} is not supported")


def _host_netns(path: str) -> bool:
    try:
        st, ours = os.stat(path), os.stat("/proc/self/ns/net")
    except OSError as e:
        raise Invalid("linux.namespaces", f"network namespace {path}: {e.strerror}") from None
    return (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino)


def _sysctl(spec: Spec) -> None:
    """Keys of namespaces the container has (runc's rules: one it joins counts, the host's
    network namespace does not); kernel.hostname is the hostname field's. Keys are names of
    plain characters, "." or "/" separated (every "." becomes "/" under /proc/sys, so no
    key reaches outside it); values are one line."""
    namespaces = {ns.type: ns.path for ns in spec.linux.namespaces}
    if spec.linux.sysctl:
        import re  # (~10 ms to import: only for a spec that needs it)
    for key, value in spec.linux.sysctl.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+([./][A-Za-z0-9_-]+)*", key) or "\n" in value:
            raise Invalid("linux.sysctl", f"{key!r} is not a sysctl name (or its value has a newline)")
        name = sysctl_name(key)
        ns = next((n for prefix, n in SYSCTL_NAMESPACES if name == prefix or (prefix.endswith(".") and
                                                                               name.startswith(prefix))), None)
        if ns == "uts" and name == "kernel.hostname" and "uts" in namespaces:
            raise Invalid("linux.sysctl", "kernel.hostname conflicts with the hostname field: set that instead")
        joined = namespaces.get(ns) if ns is not None else None
        if ns is None or ns not in namespaces or (ns == "network" and joined and _host_netns(joined)):
            raise Invalid("linux.sysctl", f"{key!r} is not a sysctl of a namespace the container has of "
                          "its own (it would change the host)")


def _resources(spec: Spec) -> None:
    r = spec.linux.resources
    if r is None:
        return
    check_resources(r)
    limit = r.memory.limit if r.memory is not None else None
    if limit is not None and 0 < limit < MEMORY_LIMIT_MIN:  # (0: unset, -1: unlimited)
        raise Invalid("linux.resources.memory.limit", f"{limit} is below the {MEMORY_LIMIT_MIN} bytes the "
                      "runtime's own processes need in the container's cgroup to start it")


def check_resources(r: Resources) -> None:
    """Device rules as runc's specconv takes them; what goes into a cgroup file's name or a
    line of it: never a path, never a newline (also ``sandbox update``'s)."""
    for i, rule in enumerate(r.devices):
        if rule.type not in (None, "", "a", "b", "c"):
            raise Invalid(f"linux.resources.devices[{i}].type", f"{rule.type!r} is not a, b or c")
        if not rule.access or not set(rule.access) <= set("rwm"):
            raise Invalid(f"linux.resources.devices[{i}].access", f"{rule.access!r}: letters of rwm, at least one")
        for name in ("major", "minor"):
            value = getattr(rule, name)
            if value is not None and value != -1:
                _range(value, 0, UINT32_MAX, f"linux.resources.devices[{i}].{name}")
    if r.hugepage_limits or r.rdma or (r.network and r.network.priorities) or r.unified:
        import re
    for i, h in enumerate(r.hugepage_limits):
        if not re.fullmatch(r"[0-9]+[KMG]B", h.page_size):
            raise Invalid(f"linux.resources.hugepageLimits[{i}].pageSize", f"{h.page_size!r} is not a page size "
                          "such as 2MB or 1GB")
    names = [("linux.resources.rdma", dev) for dev in r.rdma]
    names += [("linux.resources.network.priorities", p.name) for p in (r.network.priorities if r.network else [])]
    for field, name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
            raise Invalid(field, f"{name!r} is not a device or interface name")
    for key, value in (r.unified or {}).items():
        if not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_.]+", key) or "\n" in value:
            raise Invalid("linux.resources.unified", f"{key!r} is not a cgroup interface file name (or its value "
                          "has a newline)")


def _root_and_devices(spec: Spec) -> None:
    if spec.linux.rootfs_propagation not in (None, *PROPAGATIONS):
        raise Invalid("linux.rootfsPropagation", f"{spec.linux.rootfs_propagation!r} is not one of "
                      f"{', '.join(PROPAGATIONS)}")
    for i, d in enumerate(spec.linux.devices):
        # made where the path leads inside the root, ".." included, as runc's securejoin
        # does ("/etc/../../x" is /x); but it must end in a name
        if d.path.rstrip("/") != d.path or d.path.rpartition("/")[2] in ("", ".", ".."):
            raise Invalid(f"linux.devices[{i}].path", f"{d.path!r} does not end in a file name")
        if d.type not in ("c", "u", "b", "p"):
            raise Invalid(f"linux.devices[{i}].type", f"{d.type!r} is not c, u, b or p")
        for name in ("major", "minor", "uid", "gid"):
            value = getattr(d, name)
            if value is not None:
                _range(value, 0, UINT32_MAX, f"linux.devices[{i}].{name}")
        if d.file_mode is not None:  # the file type's bits are dropped, as runc drops them
            _range(d.file_mode & ~0o170000, 0, 0o7777, f"linux.devices[{i}].fileMode")
            _range(d.file_mode, 0, UINT32_MAX, f"linux.devices[{i}].fileMode")


def _seccomp(spec: Spec) -> None:
    sc = spec.linux.seccomp
    if sc is None:
        return
    where = "linux.seccomp"
    actions = [(f"{where}.defaultAction", sc.default_action)]
    actions += [(f"{where}.syscalls[{i}].action", r.action) for i, r in enumerate(sc.syscalls)]
    for field, action in actions:
        if action not in SECCOMP_ACTIONS:
            raise Invalid(field, f"unknown action {action!r}")
        if action == "SCMP_ACT_NOTIFY" and field.endswith("defaultAction"):  # (runc's rule)
            raise Invalid(field, "SCMP_ACT_NOTIFY cannot be the default action")
        if action == "SCMP_ACT_NOTIFY" and not sc.listener_path:
            raise Invalid(field, "SCMP_ACT_NOTIFY needs linux.seccomp.listenerPath")
    for i, rule in enumerate(sc.syscalls):
        # the fd goes to the agent by sendmsg, after the filter is loaded: notified itself,
        # it would wait for the agent that has no fd yet (runc refuses write, its own)
        if rule.action == "SCMP_ACT_NOTIFY" and set(rule.names) & {"sendmsg", "sendmmsg", "sendto"}:
            raise Invalid(f"{where}.syscalls[{i}]", "SCMP_ACT_NOTIFY on sendmsg would hang the runtime handing "
                          "the agent its fd")
    for arch in sc.architectures:
        if arch.lower().removeprefix("scmp_arch_") not in SECCOMP_ARCHES:
            raise Invalid(f"{where}.architectures", f"unknown architecture {arch!r}")
    for flag in sc.flags:
        if flag not in SECCOMP_FLAGS:
            raise Invalid(f"{where}.flags", f"unknown flag {flag!r}")
    if sc.default_errno_ret is not None:
        _range(sc.default_errno_ret, 0, 0xFFFF, f"{where}.defaultErrnoRet")
    for i, rule in enumerate(sc.syscalls):
        for name in ("includes", "excludes"):
            if getattr(rule, name):
                raise Invalid(f"{where}.syscalls[{i}].{name}", "a profile template's condition (the engine "
                              "resolves these before it writes a spec): not applied blindly")
        if rule.errno_ret is not None:
            _range(rule.errno_ret, 0, 0xFFFF, f"{where}.syscalls[{i}].errnoRet")
        for j, arg in enumerate(rule.args or ()):
            _range(arg.index, 0, 5, f"{where}.syscalls[{i}].args[{j}].index")
            _range(arg.value, 0, (1 << 64) - 1, f"{where}.syscalls[{i}].args[{j}].value")
            _range(arg.value_two, 0, (1 << 64) - 1, f"{where}.syscalls[{i}].args[{j}].valueTwo")
            if arg.op not in SECCOMP_OPS:
                raise Invalid(f"{where}.syscalls[{i}].args[{j}].op", f"unknown operator {arg.op!r}")


# In the order a reader of config.json meets the fields. Each takes the spec, raises Invalid.
CHECKS: tuple[Callable[[Spec], None], ...] = (
    _version, _process, _scheduler, _namespaces, _hostname, _hooks, _user_namespace, _unsupported, _sysctl,
    _resources, _root_and_devices, _seccomp)
PROCESS_CHECKS: tuple[Callable[[Spec], None], ...] = (_process, _scheduler)  # exec --process


def validate(spec: Spec, path: str, checks: tuple[Callable[[Spec], None], ...] = CHECKS) -> None:
    """Every check in turn; the first finding is a BundleError naming ``path`` and the field."""
    for check in checks:
        try:
            check(spec)
        except Invalid as e:
            raise BundleError(f"{path}: {e}") from None


_decoder = msgspec.json.Decoder(Spec)


def parse_spec(data: bytes, path: str = "config.json") -> Spec:
    try:
        spec = _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise BundleError(f"{path}: {e}") from None
    except msgspec.DecodeError as e:
        raise BundleError(f"{path}: invalid JSON: {e}") from None
    except RecursionError:
        raise BundleError(f"{path}: invalid JSON: nested too deeply") from None
    seccomp = spec.linux.seccomp
    if seccomp is not None and not seccomp.default_action and not seccomp.syscalls:
        # runc's specconv: a seccomp section with nothing in it is no filter at all
        spec = msgspec.structs.replace(spec, linux=msgspec.structs.replace(spec.linux, seccomp=None))
    validate(spec, path)
    if b"\\u0000" in data:  # JSON can carry a NUL only escaped: find the field it is in
        _no_nul(msgspec.to_builtins(spec), path, "$")
    return spec


def parse_process(data: bytes, base: Spec, path: str) -> Process:
    """An exec's --process file, checked as config.json's process is."""
    try:
        proc = msgspec.json.decode(data, type=Process)
    except msgspec.DecodeError as e:
        raise BundleError(f"{path}: {e}") from None
    validate(msgspec.structs.replace(base, process=proc), path, PROCESS_CHECKS)
    if b"\\u0000" in data:
        _no_nul(msgspec.to_builtins(proc), path, "$")
    return proc


def _no_nul(obj, path: str, where: str) -> None:
    """A NUL cannot pass through execve, mount(2) or a path: name the field that has one."""
    if isinstance(obj, str):
        if "\0" in obj:
            raise BundleError(f"{path}: {where}: contains a NUL character")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _no_nul(key, path, where)
            _no_nul(value, path, f"{where}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            _no_nul(value, path, f"{where}[{i}]")


class Bundle(msgspec.Struct, frozen=True):
    path: str  # absolute bundle directory
    spec: Spec
    rootfs: str  # absolute path of the root filesystem (as the host sees it)


def read_config(config: str, what: str) -> bytes:
    """A JSON file of the caller's (config.json, exec's --process): a regular file of at most
    MAX_CONFIG bytes, opened without blocking (a FIFO or /dev/zero is refused, not read)."""
    try:
        fd = os.open(config, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BundleError(f"{config}: no such file{what}") from None
    except OSError as e:
        raise BundleError(f"{config}: cannot read: {e.strerror}") from None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        import stat

        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{config}: not a regular file")
        if st.st_size > MAX_CONFIG:
            raise BundleError(f"{config}: {st.st_size} bytes is over the {MAX_CONFIG} byte limit")
        data = f.read(MAX_CONFIG + 1)
    if len(data) > MAX_CONFIG:
        raise BundleError(f"{config}: over the {MAX_CONFIG} byte limit")
    return data


def load_bundle(path: str) -> Bundle:
    """Read and validate ``<path>/config.json``; check the root filesystem exists."""
    bundle = os.path.abspath(path)
    config = os.path.join(bundle, "config.json")
    if not os.path.isdir(bundle):
        raise BundleError(f"{bundle}: no such directory (the bundle: a directory with a config.json)")
    spec = parse_spec(read_config(config, f" (is {path} an OCI bundle?)"), config)
    # runc's rule: the rootfs, relative to the bundle as the kernel resolves it, may not be
    # reached through a symlink (what the caller validated must be what gets mounted)
    rootfs = os.path.normpath(os.path.join(os.path.realpath(bundle), spec.root.path))
    if not os.path.isdir(rootfs):
        raise BundleError(f"{config}: root.path {spec.root.path!r} is not a directory")
    if os.path.realpath(rootfs) != rootfs:
        raise BundleError(f"{config}: root.path {spec.root.path!r} is reached through a symlink "
                          f"({rootfs} -> {os.path.realpath(rootfs)}); give the real path")
    return Bundle(bundle, spec, rootfs)
