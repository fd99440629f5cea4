"""CDI, the Container Device Interface: specs read (JSON or YAML, any vendor's) and written
(ours, `sandbox cdi generate`), requests resolved into container edits. Pure: files are read
here, nothing else on the host is touched.

A spec has a ``kind`` (vendor.com/class), devices by ``name``, and ``containerEdits`` (env,
deviceNodes, mounts, hooks, additionalGids) for the spec as a whole and per device. A
request names ``vendor.com/class=name``. Specs are read from /etc/cdi, then /var/run/cdi (a
later directory wins for a device both define; two files of one directory defining it are a
conflict), as the CDI library does; unknown fields and versions are refused, per file: a bad
file costs only its own devices.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import msgspec

from mounts.errors import BundleError
from mounts.spec import names_cdi

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
ANNOTATION = "cdi.k8s.io/"
MAX_SPEC = 4 << 20

_KIND = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?")
_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?")


class _C(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, frozen=True):
    pass


class DeviceNode(_C, frozen=True):
    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


class Mount(_C, frozen=True):
    host_path: str
    container_path: str
    type: str | None = None
    options: list[str] = []


class Hook(_C, frozen=True):
    hook_name: str
    path: str
    args: list[str] = []
    env: list[str] = []
    timeout: int | None = None


class ContainerEdits(_C, frozen=True):
    env: list[str] = []
    device_nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    hooks: list[Hook] = []
    additional_gids: list[int] = []
    intel_rdt: Any = None


class Device(_C, frozen=True):
    name: str
    container_edits: ContainerEdits
    annotations: dict[str, str] = {}


class CdiSpec(_C, frozen=True):
    cdi_version: str
    kind: str
    devices: list[Device]
    container_edits: ContainerEdits = ContainerEdits()
    annotations: dict[str, str] = {}


class Found(msgspec.Struct, frozen=True):
    """A device of a spec file, and the file."""

    spec: CdiSpec
    device: Device
    path: str


class Registry(msgspec.Struct):
    devices: dict[str, Found]  # qualified name -> where it is defined
    errors: dict[str, str]  # file (or qualified name, for a conflict) -> why it is not used

    def qualified_names(self) -> list[str]:
        return sorted(self.devices)


def parse(data: bytes, path: str) -> CdiSpec:
    """One spec file's bytes (JSON, or YAML by its extension); a one-line BundleError
    naming the file and the field otherwise."""
    yml = path.endswith((".yaml", ".yml"))
    try:
        if yml:
            from msgspec import yaml  # PyYAML's C loader where it has one

            spec = yaml.decode(data, type=CdiSpec)
        else:
            spec = msgspec.json.decode(data, type=CdiSpec)
    except msgspec.ValidationError as e:
        raise BundleError(f"{path}: {e}") from None
    except msgspec.DecodeError as e:
        raise BundleError(f"{path}: invalid {'YAML' if yml else 'JSON'}: {' '.join(str(e).split())}") from None
    if spec.cdi_version not in VERSIONS:
        raise BundleError(f"{path}: cdiVersion {spec.cdi_version!r} is not one of {', '.join(VERSIONS)}")
    if not _KIND.fullmatch(spec.kind):
        raise BundleError(f"{path}: kind {spec.kind!r} is not vendor.com/class")
    for i, d in enumerate(spec.devices):
        if not _NAME.fullmatch(d.name):
            raise BundleError(f"{path}: devices[{i}].name {d.name!r} is not a device name")
        _check_edits(d.container_edits, path, f"devices[{i}].containerEdits")
    _check_edits(spec.container_edits, path, "containerEdits")
    return spec


def _check_edits(edits: ContainerEdits, path: str, where: str) -> None:
    for i, h in enumerate(edits.hooks):
        if h.hook_name not in HOOK_NAMES:
            raise BundleError(f"{path}: {where}.hooks[{i}].hookName {h.hook_name!r} is not one of "
                              f"{', '.join(HOOK_NAMES)}")
    for i, n in enumerate(edits.device_nodes):
        if n.type not in (None, "c", "b", "u", "p"):
            raise BundleError(f"{path}: {where}.deviceNodes[{i}].type {n.type!r} is not c, b, u or p")
        if not os.path.isabs(n.path):
            raise BundleError(f"{path}: {where}.deviceNodes[{i}].path {n.path!r} is not absolute")
    for i, m in enumerate(edits.mounts):
        if not os.path.isabs(m.container_path):
            raise BundleError(f"{path}: {where}.mounts[{i}].containerPath {m.container_path!r} is not absolute")
    for i, e in enumerate(edits.env):
        if "=" not in e:
            raise BundleError(f"{path}: {where}.env[{i}] {e!r} is not NAME=VALUE")


def load(dirs: list[str] | tuple[str, ...] = SPEC_DIRS) -> Registry:
    """Every spec under ``dirs`` (later ones win); bad files and conflicts are recorded in
    ``errors``, never fatal to the others."""
    devices: dict[str, Found] = {}
    errors: dict[str, str] = {}
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith((".json", ".yaml", ".yml")))
            st = os.stat(d)
        except OSError:
            continue
        if not _trusted(st):  # a spec's hooks run as root on the host, its hostPaths are bound in
            errors[d] = f"{d}: owned by uid {st.st_uid} or writable by others: its specs are not read"
            continue
        here: dict[str, Found] = {}
        for name in names:
            path = os.path.join(d, name)
            try:
                # non-blocking, regular files only: a FIFO named x.json must not hang a create
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise BundleError(f"{path}: not a regular file")
                    if not _trusted(st):
                        raise BundleError(f"{path}: owned by uid {st.st_uid} or writable by others: not read")
                    data = f.read(MAX_SPEC + 1)
                if len(data) > MAX_SPEC:
                    raise BundleError(f"{path}: larger than {MAX_SPEC} bytes")
                spec = parse(data, path)
            except OSError as e:
                errors[path] = f"{path}: cannot read: {e.strerror}"
                continue
            except BundleError as e:
                errors[path] = str(e)
                continue
            for dev in spec.devices:
                qname = f"{spec.kind}={dev.name}"
                if qname in here:
                    errors[qname] = f"{qname}: defined by both {here[qname].path} and {path}"
                    continue
                here[qname] = Found(spec, dev, path)
        for qname in [q for q in here if q in errors]:
            del here[qname]
        devices.update(here)  # a later directory takes a device over
    return Registry(devices, errors)


def _trusted(st: os.stat_result) -> bool:
    """Root's (or the caller's own), and writable by nobody else."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def requests_of(annotations: dict[str, str], visible: str | None) -> tuple[list[str], str | None]:
    """(the qualified device names a container asks for, what is left of its
    NVIDIA_VISIBLE_DEVICES once they are taken out of it): from the annotations
    ``cdi.k8s.io/<key>`` (kubelet's, containerd's) and NVIDIA_VISIBLE_DEVICES entries such
    as ``nvidia.com/gpu=0`` (the toolkit's convention)."""
    names: list[str] = []
    for key in sorted(annotations):
        if key.startswith(ANNOTATION):
            names += [n.strip() for n in annotations[key].split(",") if n.strip()]
    if visible is not None and names_cdi(visible):
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        for e in entries:
            # the toolkit's convention is for NVIDIA's devices; any other vendor's (host
            # mounts, hooks) is asked for by annotation, which pod authors do not write alone
            if names_cdi(e) and not e.startswith("nvidia.com/"):
                raise BundleError(f"NVIDIA_VISIBLE_DEVICES: {e!r}: only nvidia.com devices are asked for here "
                                  "(other CDI devices: the cdi.k8s.io/ annotations)")
        names += [e for e in entries if names_cdi(e)]
        rest = [e for e in entries if not names_cdi(e)]
        visible = ",".join(rest) if rest else None
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen, visible


def resolve(names: list[str], registry: Registry) -> list[tuple[CdiSpec, list[Device]]]:
    """The specs and devices of ``names``, each spec once with its devices, in order. An
    unknown name is an error that says why (a bad spec file, a conflict)."""
    out: dict[int, tuple[CdiSpec, list[Device]]] = {}
    for n in names:
        kind, _, dev = n.partition("=")
        if not _KIND.fullmatch(kind) or not _NAME.fullmatch(dev):
            raise BundleError(f"CDI request {n!r}: not a qualified device name (vendor.com/class=name)")
        found = registry.devices.get(n)
        if found is None:
            why = registry.errors.get(n) or "; ".join(registry.errors.values())  # a spec we could not use?
            raise BundleError(f"CDI device {n!r}: not found" + (f" ({why})" if why else " in any spec"))
        entry = out.setdefault(id(found.spec), (found.spec, []))
        if found.device not in entry[1]:
            entry[1].append(found.device)
    return list(out.values())


def merged(resolved: list[tuple[CdiSpec, list[Device]]]) -> ContainerEdits:
    """The edits to apply: each spec's own once, then its devices', in request order."""
    parts = [e for spec, devs in resolved for e in (spec.container_edits, *[d.container_edits for d in devs])]
    return ContainerEdits(env=[x for p in parts for x in p.env], device_nodes=[x for p in parts for x in p.device_nodes],
                          mounts=[x for p in parts for x in p.mounts], hooks=[x for p in parts for x in p.hooks],
                          additional_gids=[x for p in parts for x in p.additional_gids],
                          intel_rdt=next((p.intel_rdt for p in parts if p.intel_rdt is not None), None))


def minimum_version(spec: CdiSpec) -> str:
    """The lowest cdiVersion whose schema has every field ``spec`` uses."""
    edits = [spec.container_edits, *[d.container_edits for d in spec.devices]]
    if any(e.additional_gids or e.intel_rdt is not None for e in edits):
        return "0.7.0"
    if spec.annotations or any(d.annotations for d in spec.devices):
        return "0.6.0"
    if any(n.host_path for e in edits for n in e.device_nodes):
        return "0.5.0"
    if any(m.type for e in edits for m in e.mounts):
        return "0.4.0"
    return "0.3.0"


KIND = "nvidia.com/gpu"  # ours (mounts/cdi_generate.py writes its spec)


# MIG devices only by our own names (GPU:GI:CI): nvidia-ctk's (GPU:MIG-index, MIG-<uuid>)
# are edited in from its spec, whose edits say which slice they mean
_NATIVE = re.compile(r"all|[0-9]{1,9}|GPU-[0-9a-fA-F-]{1,64}|[0-9]{1,9}:[0-9]{1,4}:[0-9]{1,4}")


def is_native(name: str) -> bool:
    """An NVIDIA GPU by index, UUID or all, or a MIG device by our GPU:GI:CI: served as
    NVIDIA_VISIBLE_DEVICES, not edited in."""
    kind, _, dev = name.partition("=")
    return kind == KIND and bool(_NATIVE.fullmatch(dev))


def apply(spec, names: list[str], dirs: list[str]) -> tuple[Any, list[str]]:
    """``spec`` (the OCI config) with the CDI devices ``names`` applied, and the warnings
    to print. NVIDIA's GPUs by index, UUID or ``all`` (our spec's, or nvidia-ctk's) are not
    edited in: they become NVIDIA_VISIBLE_DEVICES, served natively like any GPU request
    (the same driver files, our own mounts and cache). Any other device's edits go into the
    OCI config as an engine would put them: env, linux.devices (numbers from the host node
    where the spec leaves them out), bind mounts, hooks, additional gids."""
    from mounts import spec as S

    proc = spec.process
    _, rest = requests_of({}, proc.getenv("NVIDIA_VISIBLE_DEVICES"))
    native = [n.partition("=")[2] for n in names if is_native(n)]
    others = [n for n in names if not is_native(n)]
    env = [e for e in proc.env if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    # asked for by name, NVIDIA's devices replace the variable's legacy value (a CUDA image's
    # "all" must not widen an annotation's gpu=0); with none asked for, that value stands
    visible = ",".join(native) if native else rest
    if visible:
        env.append(f"NVIDIA_VISIBLE_DEVICES={visible}")
    warnings: list[str] = []
    devices, mounts = list(spec.linux.devices), list(spec.mounts)
    hooks = {name: list(getattr(spec.hooks, _attr(name))) if spec.hooks else [] for name in HOOK_NAMES}
    gids = list(proc.user.additional_gids)
    if others:
        edits = merged(resolve(others, load(dirs)))
        env += edits.env
        for node in edits.device_nodes:
            devices.append(_oci_device(node, others))
        for m in edits.mounts:
            options = list(m.options)
            if (m.type or "bind") == "bind" and not {"bind", "rbind"} & set(options):
                options.append("bind")
            mounts.append(S.Mount(m.container_path, m.type or "bind", m.host_path, options))
        for h in edits.hooks:
            hooks[h.hook_name].append(S.Hook(h.path, h.args, h.env, h.timeout))
        gids += [g for g in edits.additional_gids if g not in gids]
        if edits.intel_rdt is not None:
            warnings.append("CDI intelRdt edits are not applied")
    user = msgspec.structs.replace(proc.user, additional_gids=gids)
    proc = msgspec.structs.replace(proc, env=env, user=user)
    linux = msgspec.structs.replace(spec.linux, devices=devices)
    new_hooks = S.Hooks(**{_attr(n): v for n, v in hooks.items()})
    return msgspec.structs.replace(spec, process=proc, linux=linux, mounts=mounts, hooks=new_hooks), warnings


def _attr(hook_name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), hook_name)


def _oci_device(node: DeviceNode, names: list[str]):
    """A CDI device node as linux.devices has it; what the spec leaves out, the host's node
    (at hostPath, else path) says."""
    import stat as st

    from mounts import spec as S

    kind, major, minor = node.type, node.major, node.minor
    if kind is None or major is None or minor is None:
        host = node.host_path or node.path
        try:
            info = os.stat(host)
        except OSError as e:
            raise BundleError(f"CDI device {', '.join(names)}: deviceNodes {node.path}: the host node {host} "
                              f"cannot be read ({e.strerror}) to fill in its type and numbers") from None
        if not (st.S_ISCHR(info.st_mode) or st.S_ISBLK(info.st_mode)):
            raise BundleError(f"CDI device {', '.join(names)}: {host} is not a device node")
        kind = kind or ("c" if st.S_ISCHR(info.st_mode) else "b")
        major = os.major(info.st_rdev) if major is None else major
        minor = os.minor(info.st_rdev) if minor is None else minor
    return S.Device(node.path, kind, major, minor, node.file_mode, node.uid, node.gid)


def hook_actions(links: list[str], files: list[str], cache_entries: list[str]) -> list:
    """What our CDI spec's hook makes (`sandbox cdi hook`, or sandbox itself when an engine's CDI
    injection put that hook in the bundle): its --link NAME::PATH, --file PATH::CONTENT and
    --cache-entry KEY::PATH::FLAGS as plan actions. A malformed one is a BundleError."""
    from mounts import actions as A
    from mounts.ldcache import Entry

    actions: list = []
    for link in links:
        content, sep, target = link.partition("::")
        if not sep or not os.path.isabs(target) or not content or os.path.isabs(content):
            raise BundleError(f"--link {link!r}: expected RELATIVE-CONTENT::/ABSOLUTE/PATH")
        actions.append(A.Symlink(content, target))
    seen: set[str] = set()
    for item in files:
        target, sep, content = item.partition("::")
        if not sep or not os.path.isabs(target):
            raise BundleError(f"--file {item[:80]!r}: expected /ABSOLUTE/PATH::CONTENT")
        if os.path.normpath(target) in seen:
            raise BundleError(f"--file {target[:80]!r}: given twice")
        seen.add(os.path.normpath(target))
        actions.append(A.Config("", target, A.RO_LIB, content))
    entries = []
    for item in cache_entries:
        parts = item.split("::")
        if len(parts) != 3 or not os.path.isabs(parts[1]):
            raise BundleError(f"--cache-entry {item!r}: expected KEY::/ABSOLUTE/PATH::FLAGS")
        try:
            flags = int(parts[2], 0)
        except ValueError:
            raise BundleError(f"--cache-entry {item!r}: FLAGS is not a number") from None
        if not -(1 << 31) <= flags < 1 << 31:  # an int32 in the cache's entries
            raise BundleError(f"--cache-entry {item!r}: FLAGS is out of range")
        entries.append(Entry(parts[0], parts[1], flags))
    if entries:
        actions.append(A.LdCache("", "/etc/ld.so.cache", A.RO_LIB, tuple(entries)))
    return actions


def spec_hook_actions(hook_args: list[list[str]]) -> list:
    """hook_actions of our CDI spec's hooks, given their arguments (mounts.spec Hooks.cdi_args)."""
    actions: list = []
    for args in hook_args:
        given: dict[str, list[str]] = {"--link": [], "--file": [], "--cache-entry": []}
        for flag, value in zip(args[::2], args[1::2], strict=True):  # (cdi_hook_args: flags and values)
            given[flag].append(value)
        actions += hook_actions(given["--link"], given["--file"], given["--cache-entry"])
    return actions
