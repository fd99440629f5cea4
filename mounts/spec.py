"""The OCI runtime spec (the parts we read), decoded and validated with msgspec.

Accepts what ``runc spec`` and ``crun spec`` write. Every field we read is enforced; one we
cannot enforce here is refused in one line, never dropped silently.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import msgspec

from mounts import OCI_VERSION as OCI_VERSION  # (re-exported)


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


def names_cdi(value: str) -> bool:
    """Whether ``value`` (an NVIDIA_VISIBLE_DEVICES entry, or the whole list) holds a CDI
    device's qualified name, vendor.com/class=dev (the toolkit's convention)."""
    return "=" in value and "/" in value


class Process(_S, frozen=True):
    args: Annotated[list[str], msgspec.Meta(min_length=1)]
    cwd: str = ""  # required by runc: an empty or relative one is refused (mounts/bundle.py)
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
        nvidia-cdi-hook and `nvidia-ctk hook` as createContainer; and our own CDI spec's hook
        (`sandbox cdi hook`, which an engine's CDI injection puts there), whose links and
        ld.so.cache entries we make in our own root instead (cdi_hook_args)."""
        return Hooks(*[[h for h in getattr(self, f) if not is_nvidia_hook(h) and cdi_hook_args(h) is None]
                       for f in self.__struct_fields__])

    def cdi_args(self) -> list[list[str]]:
        """cdi_hook_args of each of our own CDI spec's hooks, in every list (ours() drops them)."""
        return [args for f in self.__struct_fields__ for h in getattr(self, f) if (args := cdi_hook_args(h)) is not None]

    def has_nvidia(self) -> bool:
        return any(is_nvidia_hook(h) for f in self.__struct_fields__ for h in getattr(self, f))


NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-cdi-hook")
OUR_CDI_HOOK = ("cdi", "hook")  # what `sandbox cdi generate` puts after the program in its hook's args


def cdi_hook_args(hook: Hook) -> list[str] | None:
    """The --link/--file/--cache-entry arguments of our own CDI spec's hook (sandbox/verbs/cdi.py
    writes it), or None for any other hook. Done natively, it is no power a bundle's hook
    lacks: it only links and caches in the container's own root."""
    start = our_verb(hook.path, hook.args, OUR_CDI_HOOK)
    rest = hook.args[start:] if start is not None else []
    if start is None or len(rest) % 2 or not all(a in ("--link", "--file", "--cache-entry") for a in rest[::2]):
        return None
    return rest


ENTRY_MARK = "from sandbox.cli import"  # in an older installation's -c program


def our_verb(path: str, args: list[str], verb: tuple[str, ...]) -> int | None:
    """Where the arguments of our `sandbox VERB` begin in a hook entry's args: the `sandbox`
    launcher with VERB first, or an older installation's Python program (behind a C client or
    not) with VERB right after its `-c CODE` (sandbox/executor/launcher.c's older_entry);
    None for anyone else's hook."""
    rest = args[1:]
    if tuple(rest[:len(verb)]) == verb and os.path.basename(path) == "sandbox":
        return 1 + len(verb)
    for i in range(2, len(rest) - len(verb) + 1):
        if rest[i - 2] == "-c" and ENTRY_MARK in rest[i - 1] and tuple(rest[i:i + len(verb)]) == verb:
            return 1 + i + len(verb)
    return None


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
    default_action: str = ""  # with no syscalls either: no filter (runc)
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
        return any(k.startswith("cdi.k8s.io/") for k in self.annotations) or names_cdi(visible)


# sysctls that belong to a namespace, by the namespace that must be the container's own
# (runc's rule): anything else would change the host.
SYSCTL_NAMESPACES = (("net.", "network"), ("kernel.msgmax", "ipc"), ("kernel.msgmnb", "ipc"),
                     ("kernel.msgmni", "ipc"), ("kernel.sem", "ipc"), ("kernel.shmall", "ipc"),
                     ("kernel.shmmax", "ipc"), ("kernel.shmmni", "ipc"), ("kernel.shm_rmid_forced", "ipc"),
                     ("fs.mqueue.", "ipc"), ("kernel.hostname", "uts"), ("kernel.domainname", "uts"))

_SWAP_SEPARATORS = str.maketrans("./", "/.")


def sysctl_name(key: str) -> str:
    """``key`` in sysctl(8)'s dotted form, where a "/" stands for a dot of a name's own
    (net.ipv4.conf.eth0/100.forwarding): a key whose first separator is "/" is a path under
    /proc/sys (net/ipv4/conf/eth0.100/forwarding) and is turned around (runc's
    convertSysctlVariableToDotsSeparator)."""
    head = key.split(".", 1)[0]
    return key.translate(_SWAP_SEPARATORS) if "/" in head else key


def sysctl_file(key: str) -> str:
    """The file under /proc/sys that ``key`` names, either form: net/ipv4/conf/eth0.100/forwarding
    for net.ipv4.conf.eth0/100.forwarding (runc 1.1 writes net/ipv4/conf/eth0/100/forwarding)."""
    return sysctl_name(key).translate(_SWAP_SEPARATORS)


PROPAGATIONS = ("private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable")

# Linux capabilities by number (linux/capability.h); the spec names them CAP_<NAME>.
CAPABILITIES = (
    "chown dac_override dac_read_search fowner fsetid kill setgid setuid setpcap linux_immutable "
    "net_bind_service net_broadcast net_admin net_raw ipc_lock ipc_owner sys_module sys_rawio "
    "sys_chroot sys_ptrace sys_pacct sys_admin sys_boot sys_nice sys_resource sys_time "
    "sys_tty_config mknod lease audit_write audit_control setfcap mac_override mac_admin syslog "
    "wake_alarm block_suspend audit_read perfmon bpf checkpoint_restore").split()
CAP_NUMBERS = {"CAP_" + name.upper(): i for i, name in enumerate(CAPABILITIES)}
UINT32_MAX = (1 << 32) - 1
NGROUPS_MAX = 65536  # the kernel's limit on supplementary groups (setgroups(2) refuses more)
HOST_NAME_MAX = 64  # bytes of a hostname (sethostname(2) refuses more)
# The least memory.limit a container may have: the runtime's own processes (the gofer, a
# served create's launcher and pid 1 before exec) run in the container's cgroup and need a
# few MiB (Python's gofer about 4); below, the OOM killer kills one of them. Docker's floor.
MEMORY_LIMIT_MIN = 6 << 20
RLIM_MAX = (1 << 64) - 1  # RLIM_INFINITY as the spec writes it ("unlimited")
RLIMITS = frozenset(
    "RLIMIT_AS RLIMIT_CORE RLIMIT_CPU RLIMIT_DATA RLIMIT_FSIZE RLIMIT_LOCKS RLIMIT_MEMLOCK "
    "RLIMIT_MSGQUEUE RLIMIT_NICE RLIMIT_NOFILE RLIMIT_NPROC RLIMIT_RSS RLIMIT_RTPRIO "
    "RLIMIT_RTTIME RLIMIT_SIGPENDING RLIMIT_STACK".split())

NAMESPACE_TYPES = ("pid", "network", "mount", "ipc", "uts", "user", "cgroup")
