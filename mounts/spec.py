"""The OCI runtime spec (the parts we read), decoded and validated with msgspec.

Accepts what ``runc spec`` and ``crun spec`` write. Every field we read is enforced; one we
cannot enforce here is refused in one line, never dropped silently.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import msgspec

from mounts.errors import BundleError


class _S(msgspec.Struct, rename="camel", frozen=True, omit_defaults=True):
    pass


class User(_S, frozen=True):
    uid: int = 0
    gid: int = 0
    umask: int | None = None
    additional_gids: list[int] = []


class Capabilities(_S, frozen=True):
    bounding: list[str] = []
    effective: list[str] = []
    inheritable: list[str] = []
    permitted: list[str] = []
    ambient: list[str] = []


class Rlimit(_S, frozen=True):
    type: str
    hard: int
    soft: int


class IOPriority(_S, frozen=True):
    class_: str = msgspec.field(name="class")
    priority: int = 0


class Scheduler(_S, frozen=True):
    policy: str
    nice: int = 0
    priority: int = 0
    flags: list[str] = []
    runtime: int = 0
    deadline: int = 0
    period: int = 0


IOPRIO_CLASSES = {"IOPRIO_CLASS_RT": 1, "IOPRIO_CLASS_BE": 2, "IOPRIO_CLASS_IDLE": 3}
SCHED_POLICIES = {"SCHED_OTHER": 0, "SCHED_FIFO": 1, "SCHED_RR": 2, "SCHED_BATCH": 3, "SCHED_ISO": 4,
                  "SCHED_IDLE": 5, "SCHED_DEADLINE": 6}
SCHED_FLAGS = {"SCHED_FLAG_RESET_ON_FORK": 0x01, "SCHED_FLAG_RECLAIM": 0x02, "SCHED_FLAG_DL_OVERRUN": 0x04,
               "SCHED_FLAG_KEEP_POLICY": 0x08, "SCHED_FLAG_KEEP_PARAMS": 0x10, "SCHED_FLAG_UTIL_CLAMP_MIN": 0x20,
               "SCHED_FLAG_UTIL_CLAMP_MAX": 0x40}
PERSONALITY_DOMAINS = {"LINUX": 0x0000, "LINUX32": 0x0008}


class Process(_S, frozen=True):
    args: Annotated[list[str], msgspec.Meta(min_length=1)]
    cwd: str = "/"
    env: list[str] = []
    terminal: bool = False
    user: User = User()
    capabilities: Capabilities | None = None
    rlimits: list[Rlimit] = []
    no_new_privileges: bool = False
    console_size: Any = None
    apparmor_profile: str | None = None
    selinux_label: str | None = None
    oom_score_adj: int | None = None
    io_priority: IOPriority | None = None
    scheduler: Scheduler | None = None

    def getenv(self, name: str) -> str | None:
        """The last value of ``name`` in ``env`` (as execve's consumers see it), or None."""
        prefix = name + "="
        found = None
        for item in self.env:
            if item.startswith(prefix):
                found = item[len(prefix):]
        return found


class Root(_S, frozen=True):
    path: str
    readonly: bool = False


class Mount(_S, frozen=True):
    destination: str
    type: str | None = None
    source: str | None = None
    options: list[str] = []


class Hook(_S, frozen=True):
    path: str
    args: list[str] = []
    env: list[str] = []
    timeout: int | None = None


class Hooks(_S, frozen=True):
    prestart: list[Hook] = []
    create_runtime: list[Hook] = []
    create_container: list[Hook] = []
    start_container: list[Hook] = []
    poststart: list[Hook] = []
    poststop: list[Hook] = []

    def ours(self) -> Hooks:
        """The hooks we run: NVIDIA's own are dropped, because we do their work natively
        (as runsc does): nvidia-container-runtime-hook / nvidia-container-toolkit as prestart,
        nvidia-cdi-hook and `nvidia-ctk hook` as createContainer."""
        return Hooks(*[[h for h in getattr(self, f) if not is_nvidia_hook(h)] for f in self.__struct_fields__])

    def has_nvidia(self) -> bool:
        return any(is_nvidia_hook(h) for f in self.__struct_fields__ for h in getattr(self, f))


NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-cdi-hook")


def is_nvidia_hook(hook: Hook) -> bool:
    name = os.path.basename(hook.path)
    return name in NVIDIA_HOOKS or (name == "nvidia-ctk" and "hook" in hook.args[1:2])


class Namespace(_S, frozen=True):
    type: str
    path: str | None = None


class Device(_S, frozen=True):
    path: str
    type: str
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


SECCOMP_ACTIONS = ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP",
                   "SCMP_ACT_ERRNO", "SCMP_ACT_TRACE", "SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_NOTIFY")
SECCOMP_OPS = ("SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT",
               "SCMP_CMP_MASKED_EQ")
SECCOMP_FLAGS = ("SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW")


class SeccompArg(_S, frozen=True):
    index: int
    op: str
    value: int = 0
    value_two: int = 0


class SeccompSyscall(_S, frozen=True):
    names: list[str]
    action: str
    errno_ret: int | None = None
    args: list[SeccompArg] | None = None  # podman's own seccomp.json writes null
    # conditions of the engines' profile templates, resolved by the engine before a spec is
    # written: a rule meant only for CAP_SYS_ADMIN must not apply to every container
    includes: Any = None
    excludes: Any = None


class Seccomp(_S, frozen=True):
    default_action: str
    default_errno_ret: int | None = None
    architectures: list[str] = []
    flags: list[str] = []
    listener_path: str | None = None
    listener_metadata: str | None = None
    syscalls: list[SeccompSyscall] = []


class DeviceRule(_S, frozen=True):
    allow: bool
    type: str | None = None  # a (all), c, b; None means all
    major: int | None = None  # None: any (*)
    minor: int | None = None
    access: str | None = None  # some of r, w, m; None means rwm


class Memory(_S, frozen=True):
    limit: int | None = None
    reservation: int | None = None
    swap: int | None = None
    kernel: int | None = None
    kernel_tcp: int | None = msgspec.field(default=None, name="kernelTCP")
    swappiness: int | None = None
    disable_oom_killer: bool | None = msgspec.field(default=None, name="disableOOMKiller")


class Cpu(_S, frozen=True):
    shares: int | None = None
    quota: int | None = None
    period: int | None = None
    realtime_runtime: int | None = None
    realtime_period: int | None = None
    cpus: str | None = None
    mems: str | None = None


class Pids(_S, frozen=True):
    limit: int


class WeightDevice(_S, frozen=True):
    major: int
    minor: int
    weight: int | None = None
    leaf_weight: int | None = None


class ThrottleDevice(_S, frozen=True):
    major: int
    minor: int
    rate: int = 0


class BlockIO(_S, frozen=True):
    weight: int | None = None
    leaf_weight: int | None = None
    weight_device: list[WeightDevice] = []
    throttle_read_bps_device: list[ThrottleDevice] = []
    throttle_write_bps_device: list[ThrottleDevice] = []
    throttle_read_iops_device: list[ThrottleDevice] = msgspec.field(default=[], name="throttleReadIOPSDevice")
    throttle_write_iops_device: list[ThrottleDevice] = msgspec.field(default=[], name="throttleWriteIOPSDevice")


class HugepageLimit(_S, frozen=True):
    page_size: str
    limit: int


class InterfacePriority(_S, frozen=True):
    name: str
    priority: int


class Network(_S, frozen=True):
    class_id: int | None = msgspec.field(default=None, name="classID")
    priorities: list[InterfacePriority] = []


class Rdma(_S, frozen=True):
    hca_handles: int | None = None
    hca_objects: int | None = None


class Resources(_S, frozen=True):
    devices: list[DeviceRule] = []
    memory: Memory | None = None
    cpu: Cpu | None = None
    pids: Pids | None = None
    block_io: BlockIO | None = msgspec.field(default=None, name="blockIO")
    hugepage_limits: list[HugepageLimit] = []
    network: Network | None = None
    rdma: dict[str, Rdma] = {}
    unified: dict[str, str] | None = None


class IDMapping(_S, frozen=True):
    container_id: int = msgspec.field(name="containerID")
    host_id: int = msgspec.field(name="hostID")
    size: int


class Personality(_S, frozen=True):
    domain: str
    flags: list[str] = []


class Linux(_S, frozen=True):
    namespaces: list[Namespace] = []
    devices: list[Device] = []
    masked_paths: list[str] = []
    readonly_paths: list[str] = []
    rootfs_propagation: str | None = None
    # parsed but not enforced by this launcher (named in a warning when set)
    resources: Resources | None = None
    cgroups_path: str | None = None
    seccomp: Seccomp | None = None
    sysctl: dict[str, str] = {}
    uid_mappings: list[IDMapping] = []
    gid_mappings: list[IDMapping] = []
    mount_label: str | None = None
    intel_rdt: Any = None
    personality: Personality | None = None


class Spec(_S, frozen=True):
    oci_version: str
    root: Root
    process: Process | None = None
    hostname: str | None = None
    mounts: list[Mount] = []
    hooks: Hooks | None = None
    annotations: dict[str, str] = {}
    linux: Linux = Linux()

    def asks_for_cdi(self) -> bool:
        """Whether a CDI device is asked for (mounts/cdi.py reads which): a cdi.k8s.io/
        annotation, or a qualified name (vendor.com/class=dev) in NVIDIA_VISIBLE_DEVICES."""
        visible = (self.process.getenv("NVIDIA_VISIBLE_DEVICES") if self.process else None) or ""
        return any(k.startswith("cdi.k8s.io/") for k in self.annotations) or ("=" in visible and "/" in visible)


# sysctls that belong to a namespace, by the namespace that must be the container's own
# (runc's rule): anything else would change the host.
SYSCTL_NAMESPACES = (("net.", "network"), ("kernel.msgmax", "ipc"), ("kernel.msgmnb", "ipc"),
                     ("kernel.msgmni", "ipc"), ("kernel.sem", "ipc"), ("kernel.shmall", "ipc"),
                     ("kernel.shmmax", "ipc"), ("kernel.shmmni", "ipc"), ("kernel.shm_rmid_forced", "ipc"),
                     ("fs.mqueue.", "ipc"), ("kernel.hostname", "uts"), ("kernel.domainname", "uts"))

PROPAGATIONS = ("private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable")

_decoder = msgspec.json.Decoder(Spec)


# Linux capabilities by number (linux/capability.h); the spec names them CAP_<NAME>.
CAPABILITIES = (
    "chown dac_override dac_read_search fowner fsetid kill setgid setuid setpcap linux_immutable "
    "net_bind_service net_broadcast net_admin net_raw ipc_lock ipc_owner sys_module sys_rawio "
    "sys_chroot sys_ptrace sys_pacct sys_admin sys_boot sys_nice sys_resource sys_time "
    "sys_tty_config mknod lease audit_write audit_control setfcap mac_override mac_admin syslog "
    "wake_alarm block_suspend audit_read perfmon bpf checkpoint_restore").split()
CAP_NUMBERS = {"CAP_" + name.upper(): i for i, name in enumerate(CAPABILITIES)}
UINT32_MAX = (1 << 32) - 1
RLIM_MAX = (1 << 64) - 1  # RLIM_INFINITY as the spec writes it ("unlimited")
RLIMITS = frozenset(
    "RLIMIT_AS RLIMIT_CORE RLIMIT_CPU RLIMIT_DATA RLIMIT_FSIZE RLIMIT_LOCKS RLIMIT_MEMLOCK "
    "RLIMIT_MSGQUEUE RLIMIT_NICE RLIMIT_NOFILE RLIMIT_NPROC RLIMIT_RSS RLIMIT_RTPRIO "
    "RLIMIT_RTTIME RLIMIT_SIGPENDING RLIMIT_STACK".split())


def parse_spec(data: bytes, path: str = "config.json") -> Spec:
    try:
        spec = _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise BundleError(f"{path}: {e}") from None
    except msgspec.DecodeError as e:
        raise BundleError(f"{path}: invalid JSON: {e}") from None
    except RecursionError:
        raise BundleError(f"{path}: invalid JSON: nested too deeply") from None
    validate(spec, path)
    if b"\\u0000" in data:  # JSON can carry a NUL only escaped: find the field it is in
        _no_nul(msgspec.to_builtins(spec), path, "$")
    return spec


def _valid_oci_version(v: str) -> bool:
    """1.MINOR.PATCH, with a pre-release tag if any (1.0.2-dev): what engines write."""
    core, _, tag = v.partition("-")
    parts = core.split(".")
    return (len(parts) == 3 and parts[0] == "1" and all(p.isascii() and p.isdigit() for p in parts)
            and (not tag or tag.replace(".", "").replace("-", "").isalnum()))


def validate(spec: Spec, path: str) -> None:
    """What msgspec's types cannot say: the numeric ranges the kernel takes (runc's types
    are uint32 and uint64; a bigger number is an error here, never an overflow later)."""
    def check(value: int, lo: int, hi: int, field: str) -> None:
        if not lo <= value <= hi:
            raise BundleError(f"{path}: {field}: {value} is out of range ({lo}..{hi})")

    if not _valid_oci_version(spec.oci_version):
        raise BundleError(f"{path}: ociVersion: {spec.oci_version!r} is not a version 1.x.y of the runtime spec")
    proc = spec.process
    if proc is not None:
        check(proc.user.uid, 0, UINT32_MAX, "process.user.uid")
        check(proc.user.gid, 0, UINT32_MAX, "process.user.gid")
        for i, gid in enumerate(proc.user.additional_gids):
            check(gid, 0, UINT32_MAX, f"process.user.additionalGids[{i}]")
        if proc.user.umask is not None:
            check(proc.user.umask, 0, 0o7777, "process.user.umask")
        if proc.capabilities is not None:
            for field in Capabilities.__struct_fields__:
                for name in getattr(proc.capabilities, field):
                    if name.upper() not in CAP_NUMBERS:
                        raise BundleError(f"{path}: process.capabilities.{field}: unknown capability {name!r}")
        for i, rl in enumerate(proc.rlimits):
            if rl.type not in RLIMITS:
                raise BundleError(f"{path}: process.rlimits[{i}].type: unknown limit {rl.type!r}")
            check(rl.soft, 0, RLIM_MAX, f"process.rlimits[{i}].soft")
            check(rl.hard, 0, RLIM_MAX, f"process.rlimits[{i}].hard")
    if spec.linux.seccomp is not None:
        _validate_seccomp(spec.linux.seccomp, path, check)
    if proc is not None and proc.oom_score_adj is not None:
        check(proc.oom_score_adj, -1000, 1000, "process.oomScoreAdj")
    if proc is not None and proc.io_priority is not None:
        if proc.io_priority.class_ not in IOPRIO_CLASSES:
            raise BundleError(f"{path}: process.ioPriority.class: {proc.io_priority.class_!r} is not one of "
                              f"{', '.join(IOPRIO_CLASSES)}")
        check(proc.io_priority.priority, 0, 7, "process.ioPriority.priority")
    if proc is not None and proc.scheduler is not None:
        sched = proc.scheduler
        if sched.policy not in SCHED_POLICIES:
            raise BundleError(f"{path}: process.scheduler.policy: {sched.policy!r} is not one of "
                              f"{', '.join(SCHED_POLICIES)}")
        for flag in sched.flags:
            if flag not in SCHED_FLAGS:
                raise BundleError(f"{path}: process.scheduler.flags: unknown flag {flag!r}")
        check(sched.nice, -20, 19, "process.scheduler.nice")
        check(sched.priority, 0, 99, "process.scheduler.priority")
        for name in ("runtime", "deadline", "period"):
            check(getattr(sched, name), 0, (1 << 64) - 1, f"process.scheduler.{name}")
        if (sched.policy == "SCHED_DEADLINE" and "SCHED_FLAG_RESET_ON_FORK" not in sched.flags
                and spec.hooks is not None and spec.hooks.start_container):
            # the hooks run in the container's process, which holds the policy by then
            raise BundleError(f"{path}: process.scheduler: a SCHED_DEADLINE task cannot fork to run "
                              "hooks.startContainer (add SCHED_FLAG_RESET_ON_FORK)")
    _validate_user_namespace(spec, path, check)
    if spec.linux.intel_rdt is not None:
        raise BundleError(f"{path}: linux.intelRdt: Intel RDT (resctrl) is not supported")
    pers = spec.linux.personality
    if pers is not None:
        if pers.domain not in PERSONALITY_DOMAINS:
            raise BundleError(f"{path}: linux.personality.domain: {pers.domain!r} is not LINUX or LINUX32")
        if pers.flags:  # the spec defines none yet (runc takes none)
            raise BundleError(f"{path}: linux.personality.flags: {pers.flags[0]!r} is not supported")
    new_ns = {ns.type for ns in spec.linux.namespaces if not ns.path}
    for key, value in spec.linux.sysctl.items():
        ns = next((n for prefix, n in SYSCTL_NAMESPACES if key == prefix or (prefix.endswith(".") and
                                                                              key.startswith(prefix))), None)
        if ns is None or ns not in new_ns or not key.replace(".", "").replace("_", "").replace("-", "").isalnum() \
                or "\n" in value:
            raise BundleError(f"{path}: linux.sysctl: {key!r} is not a sysctl of a namespace the container "
                              "has of its own (it would change the host)")
    for i, rule in enumerate(spec.linux.resources.devices if spec.linux.resources else []):
        if rule.type not in (None, "a", "b", "c") or not set(rule.access or "rwm") <= set("rwm") \
                or not rule.access and rule.access is not None:
            raise BundleError(f"{path}: linux.resources.devices[{i}]: type must be a, b or c and access "
                              f"letters of rwm (got {rule.type!r}, {rule.access!r})")
        for name in ("major", "minor"):
            value = getattr(rule, name)
            if value is not None and value != -1:
                check(value, 0, UINT32_MAX, f"linux.resources.devices[{i}].{name}")
    if spec.linux.resources is not None:
        _validate_resources(spec.linux.resources, path)
    if spec.linux.rootfs_propagation not in (None, *PROPAGATIONS):
        raise BundleError(f"{path}: linux.rootfsPropagation: {spec.linux.rootfs_propagation!r} is not one of "
                          f"{', '.join(PROPAGATIONS)}")
    for i, d in enumerate(spec.linux.devices):
        for name in ("major", "minor", "uid", "gid"):
            value = getattr(d, name)
            if value is not None:
                check(value, 0, UINT32_MAX, f"linux.devices[{i}].{name}")
        if d.file_mode is not None:
            check(d.file_mode, 0, 0o7777, f"linux.devices[{i}].fileMode")


def _validate_user_namespace(spec: Spec, path: str, check) -> None:
    """Mappings go with a new user namespace, and it needs them (runc's rules); the
    container's root must be mapped (it becomes root in there to build the container)."""
    user = next((ns for ns in spec.linux.namespaces if ns.type == "user"), None)
    maps = (("uidMappings", spec.linux.uid_mappings), ("gidMappings", spec.linux.gid_mappings))
    for field, mapping in maps:
        for i, m in enumerate(mapping):
            for name, camel in (("container_id", "containerID"), ("host_id", "hostID"), ("size", "size")):
                check(getattr(m, name), 1 if name == "size" else 0, UINT32_MAX, f"linux.{field}[{i}].{camel}")
        if user is None and mapping:
            raise BundleError(f"{path}: linux.{field}: mappings without a user namespace in linux.namespaces")
        if user is not None and not user.path:
            if not mapping:
                raise BundleError(f"{path}: linux.{field}: a new user namespace needs mappings")
            if not any(m.container_id == 0 for m in mapping):
                raise BundleError(f"{path}: linux.{field}: the container's root (0) is not mapped")


def _validate_resources(r: Resources, path: str) -> None:
    """What goes into a cgroup file's name or a line of it: never a path, never a newline."""
    import re

    for i, h in enumerate(r.hugepage_limits):
        if not re.fullmatch(r"[0-9]+[KMG]B", h.page_size):
            raise BundleError(f"{path}: linux.resources.hugepageLimits[{i}].pageSize: {h.page_size!r} is not "
                              "a page size such as 2MB or 1GB")
    names = [("linux.resources.rdma", dev) for dev in r.rdma]
    names += [("linux.resources.network.priorities", p.name) for p in (r.network.priorities if r.network else [])]
    for field, name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
            raise BundleError(f"{path}: {field}: {name!r} is not a device or interface name")
    for key, value in (r.unified or {}).items():
        if not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_.]+", key) or "\n" in value:
            raise BundleError(f"{path}: linux.resources.unified: {key!r} is not a cgroup interface file name "
                              "(or its value has a newline)")


def _validate_seccomp(sc: Seccomp, path: str, check) -> None:
    where = "linux.seccomp"
    actions = [(f"{where}.defaultAction", sc.default_action)]
    actions += [(f"{where}.syscalls[{i}].action", r.action) for i, r in enumerate(sc.syscalls)]
    for field, action in actions:
        if action not in SECCOMP_ACTIONS:
            raise BundleError(f"{path}: {field}: unknown action {action!r}")
        if action == "SCMP_ACT_NOTIFY" and field.endswith("defaultAction"):  # (runc's rule)
            raise BundleError(f"{path}: {field}: SCMP_ACT_NOTIFY cannot be the default action")
        if action == "SCMP_ACT_NOTIFY" and not sc.listener_path:
            raise BundleError(f"{path}: {field}: SCMP_ACT_NOTIFY needs linux.seccomp.listenerPath")
    for i, rule in enumerate(sc.syscalls):
        # the fd goes to the agent by sendmsg, after the filter is loaded: notified itself,
        # it would wait for the agent that has no fd yet (runc refuses write, its own)
        if rule.action == "SCMP_ACT_NOTIFY" and set(rule.names) & {"sendmsg", "sendmmsg", "sendto"}:
            raise BundleError(f"{path}: {where}.syscalls[{i}]: SCMP_ACT_NOTIFY on sendmsg would hang the "
                              "runtime handing the agent its fd")
    for flag in sc.flags:
        if flag not in SECCOMP_FLAGS:
            raise BundleError(f"{path}: {where}.flags: unknown flag {flag!r}")
    if sc.default_errno_ret is not None:
        check(sc.default_errno_ret, 0, 0xFFFF, f"{where}.defaultErrnoRet")
    for i, rule in enumerate(sc.syscalls):
        for name in ("includes", "excludes"):
            if getattr(rule, name):
                raise BundleError(f"{path}: {where}.syscalls[{i}].{name}: a profile template's condition "
                                  "(the engine resolves these before it writes a spec): not applied blindly")
        if rule.errno_ret is not None:
            check(rule.errno_ret, 0, 0xFFFF, f"{where}.syscalls[{i}].errnoRet")
        for j, arg in enumerate(rule.args or ()):
            check(arg.index, 0, 5, f"{where}.syscalls[{i}].args[{j}].index")
            check(arg.value, 0, (1 << 64) - 1, f"{where}.syscalls[{i}].args[{j}].value")
            check(arg.value_two, 0, (1 << 64) - 1, f"{where}.syscalls[{i}].args[{j}].valueTwo")
            if arg.op not in SECCOMP_OPS:
                raise BundleError(f"{path}: {where}.syscalls[{i}].args[{j}].op: unknown operator {arg.op!r}")


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


def load_bundle(path: str) -> Bundle:
    """Read and validate ``<path>/config.json``; check the root filesystem exists."""
    bundle = os.path.abspath(path)
    config = os.path.join(bundle, "config.json")
    try:
        with open(config, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise BundleError(f"{config}: no such file (is {path} an OCI bundle?)") from None
    except OSError as e:
        raise BundleError(f"{config}: cannot read: {e.strerror}") from None
    spec = parse_spec(data, config)
    # runc's rule: the rootfs, relative to the bundle as the kernel resolves it, may not be
    # reached through a symlink (what the caller validated must be what gets mounted)
    rootfs = os.path.normpath(os.path.join(os.path.realpath(bundle), spec.root.path))
    if not os.path.isdir(rootfs):
        raise BundleError(f"{config}: root.path {spec.root.path!r} is not a directory")
    if os.path.realpath(rootfs) != rootfs:
        raise BundleError(f"{config}: root.path {spec.root.path!r} is reached through a symlink "
                          f"({rootfs} -> {os.path.realpath(rootfs)}); give the real path")
    return Bundle(bundle, spec, rootfs)
