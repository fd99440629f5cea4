"""The GPU request a bundle makes: which devices, which capabilities, which requirements.

Pure functions of the spec (and CLI overrides), following nvidia-container-toolkit's rules:
``NVIDIA_VISIBLE_DEVICES``, ``NVIDIA_DRIVER_CAPABILITIES``, ``NVIDIA_REQUIRE_*``,
``NVIDIA_DISABLE_REQUIRE``, legacy CUDA images, and ``linux.devices`` naming /dev/nvidiactl.
"""

from __future__ import annotations

import operator
import re

import msgspec

from mounts.errors import RequestError
from mounts.spec import Spec

CAPABILITIES = ("compute", "utility", "video", "graphics", "display", "ngx", "compat32")
DEFAULT_CAPABILITIES = frozenset({"compute", "utility"})
NVIDIA_DEV = re.compile(r"/dev/nvidia([0-9]{1,9})")
_VERSION = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,3}")


class GpuRequest(msgspec.Struct, frozen=True):
    devices: tuple[str, ...]  # ("all",), () for "none", or the entries as given
    capabilities: frozenset[str]
    requirements: tuple[tuple[str, str], ...] = ()  # (env name, expression)
    source: str = "NVIDIA_VISIBLE_DEVICES"  # where the device list came from, for messages
    imex: tuple[str, ...] = ()  # NVIDIA_IMEX_CHANNELS: ("all",) or channel numbers
    mig_config: tuple[str, ...] = ()  # NVIDIA_MIG_CONFIG_DEVICES: ("all",) or GPUs
    mig_monitor: tuple[str, ...] = ()  # NVIDIA_MIG_MONITOR_DEVICES


def parse_imex(value: str | None) -> tuple[str, ...]:
    """NVIDIA_IMEX_CHANNELS: all, none (or empty), or a comma list of channel numbers."""
    entries = tuple(e.strip() for e in (value or "").split(",") if e.strip())
    if entries in ((), ("none",), ("void",)):
        return ()
    if "all" in entries:
        return ("all",)
    for e in entries:
        if not re.fullmatch(r"[0-9]{1,9}", e):  # ASCII only, as device indices
            raise RequestError(f"NVIDIA_IMEX_CHANNELS: {e!r} is not a channel number (or all, none)")
    return tuple(dict.fromkeys(str(int(e)) for e in entries))


def parse_capabilities(value: str | None, where: str = "NVIDIA_DRIVER_CAPABILITIES") -> frozenset[str]:
    if value is None or value.strip() == "":
        return DEFAULT_CAPABILITIES
    caps = {c.strip() for c in value.split(",") if c.strip()}
    unknown = sorted(caps - set(CAPABILITIES) - {"all"})
    if unknown:  # checked before "all": all,foo is as wrong as foo
        raise RequestError(f"{where}: unknown capability {unknown[0]!r} "
                           f"(expected a comma list of {', '.join(CAPABILITIES)} or all)")
    return frozenset(CAPABILITIES) if "all" in caps else frozenset(caps)


def parse_devices(value: str) -> tuple[str, ...]:
    entries = tuple(e.strip() for e in value.split(",") if e.strip())
    if "all" in entries:
        return ("all",)
    if entries == ("none",):
        return ()
    return entries


def _capabilities(cli: str | None, env: str | None, unset: frozenset[str]) -> frozenset[str]:
    """--capabilities over NVIDIA_DRIVER_CAPABILITIES over ``unset`` (the default when the
    variable is absent; set but empty, it means compute,utility)."""
    if cli is not None:
        return parse_capabilities(cli, "--capabilities")
    return unset if env is None else parse_capabilities(env)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def gpu_request(spec: Spec, gpus: str | None = None, capabilities: str | None = None) -> GpuRequest | None:
    """The GPU request of ``spec``, or None when it asks for no GPU.

    ``gpus`` and ``capabilities`` are the CLI's ``--gpus`` and ``--capabilities``: they
    override the environment.
    """
    env = spec.process.getenv if spec.process is not None else (lambda _name: None)
    visible = env("NVIDIA_VISIBLE_DEVICES")
    caps_env = env("NVIDIA_DRIVER_CAPABILITIES")
    legacy = env("CUDA_VERSION") is not None and env("NVIDIA_REQUIRE_CUDA") is None
    source = "NVIDIA_VISIBLE_DEVICES"

    if gpus is not None:
        visible, source = gpus, "--gpus"
    elif visible is None and legacy:
        visible = "all"
    elif visible is None:
        listed = _listed_gpus(spec)
        if listed is not None:
            # The GKE way: nodes named in linux.devices, libraries come as ordinary mounts.
            return GpuRequest(listed, _capabilities(capabilities, caps_env, frozenset()), source="linux.devices")
    if visible is None or visible.strip() in ("", "void"):
        return None

    caps = _capabilities(capabilities, caps_env, frozenset(CAPABILITIES) if legacy else DEFAULT_CAPABILITIES)

    requirements: list[tuple[str, str]] = []
    if not _truthy(env("NVIDIA_DISABLE_REQUIRE")) and spec.process is not None:
        names = sorted({i.partition("=")[0] for i in spec.process.env if i.startswith("NVIDIA_REQUIRE_")})
        for name in names:
            value = env(name) or ""
            if value.strip():
                requirements.append((name, value))
        if legacy:
            cuda = env("CUDA_VERSION") or ""
            m = re.match(r"([0-9]{1,9})\.([0-9]{1,9})", cuda)
            if not m:
                raise RequestError(f"CUDA_VERSION: {cuda!r} is not a version (major.minor)")
            requirements.append(("CUDA_VERSION", f"cuda>={m.group(1)}.{m.group(2)}"))
    mig = {}
    for what in ("CONFIG", "MONITOR"):
        name = f"NVIDIA_MIG_{what}_DEVICES"
        mig[what] = () if (env(name) or "").strip() in ("", "none", "void") else parse_devices(env(name) or "")
        if mig[what] and not _privileged(spec):
            # the toolkit's rule: MIG configuration and monitoring are for privileged containers
            raise RequestError(f"{name}: only a privileged container (CAP_SYS_ADMIN in "
                               "process.capabilities.bounding) may ask for MIG capabilities")
    return GpuRequest(parse_devices(visible), caps, tuple(requirements), source, parse_imex(env("NVIDIA_IMEX_CHANNELS")),
                      mig["CONFIG"], mig["MONITOR"])


def _privileged(spec: Spec) -> bool:
    caps = spec.process.capabilities if spec.process is not None else None
    return caps is not None and "CAP_SYS_ADMIN" in caps.bounding


def _listed_gpus(spec: Spec) -> tuple[str, ...] | None:
    paths = [d.path for d in spec.linux.devices]
    if "/dev/nvidiactl" not in paths:
        return None
    return tuple(m.group(1) for p in paths if (m := NVIDIA_DEV.fullmatch(p)))


# --- requirements ------------------------------------------------------------------------

_OPS = {">=": operator.ge, "<=": operator.le, "!=": operator.ne, "==": operator.eq,
        "=": operator.eq, ">": operator.gt, "<": operator.lt}
_COND = re.compile(r"^(cuda|driver|arch|brand)(>=|<=|!=|==|=|>|<)(.+)$")


def _version_tuple(v: str, where: str) -> tuple[int, ...]:
    if not _VERSION.fullmatch(v):
        raise RequestError(f"{where}: {v!r} is not a version")
    return tuple(int(x) for x in v.split("."))


def brand_of(model: str) -> str:
    """The brand nvidia-container-cli reports, from the model name in /proc."""
    m = model.lower()
    for brand in ("tesla", "quadro", "geforce", "titan", "nvs", "grid"):
        if brand in m:
            return brand
    if "rtx" in m:
        return "nvidiartx"
    return "nvidia"


def check_requirements(request: GpuRequest, driver_version: str, cuda: str | None,
                       brands: list[str], archs: list[str]) -> None:
    """Raise RequestError naming the first requirement (env var and expression) not met.

    Space separates alternatives (OR), comma separates conditions (AND). ``arch`` can only be
    met when the GPUs' architectures are known; /proc does not show them, so an ``arch``
    condition is false unless ``archs`` is given.
    """
    facts = {"cuda": [cuda] if cuda else [], "driver": [driver_version]}
    for name, expr in request.requirements:
        where = f"{name}={expr!r}"
        alternatives = expr.split()
        if not any(_holds(alt, facts, brands, archs, where) for alt in alternatives):
            have = f"driver {driver_version}, CUDA {cuda or 'unknown'}"
            raise RequestError(f"requirement {where} not met ({have})")


def _holds(alternative: str, facts, brands, archs, where: str) -> bool:
    for cond in alternative.split(","):
        m = _COND.match(cond.strip())
        if not m:
            raise RequestError(f"{where}: cannot parse condition {cond!r} "
                               "(expected cuda|driver|arch|brand, an operator and a value)")
        key, op, value = m.groups()
        fn = _OPS[op]
        if key in ("cuda", "driver"):
            want = _version_tuple(value, where)
            got = [_version_tuple(v, where) for v in facts[key]]
            # compare on the precision the condition gives (cuda>=12 means 12.x)
            if not got or not all(fn(g[:len(want)], want) for g in got):
                return False
        elif key == "brand":
            if not brands or not all(fn(b, value.lower()) for b in brands):
                return False
        else:
            if not archs or not all(fn(_version_tuple(a, where), _version_tuple(value, where)) for a in archs):
                return False
    return True


def cap_request(request: GpuRequest, max_capabilities: str, where: str = "--capabilities") -> GpuRequest:
    """``request`` with its capabilities cut to the ceiling ``max_capabilities``."""
    allowed = parse_capabilities(max_capabilities, where)
    return msgspec.structs.replace(request, capabilities=request.capabilities & allowed)


def resolve(spec: Spec, gpus: str | None = None, capabilities: str | None = None,
            max_capabilities: str | None = None, cdi_dirs: tuple[str, ...] | list[str] = (),
            native_only: bool = False) -> tuple[Spec, GpuRequest | None, list[str]]:
    """The one way from a bundle's spec (and the flags, and the config's ceiling) to its GPU
    request, for run and create, the hook, ``sandbox plan`` and the API: the CDI devices it
    names applied first (mounts/cdi.py: NVIDIA's natively, another vendor's edits from the
    specs in CDI's directories and ``cdi_dirs``), then the request read from the result.
    ``native_only`` (a hook, which can only mount): another vendor's device is an error.
    Returns (the spec as edited, the request or None, CDI's warnings)."""
    warnings: list[str] = []
    if spec.asks_for_cdi():
        from mounts import cdi

        names, _ = cdi.requests_of(spec.annotations, spec.process.getenv("NVIDIA_VISIBLE_DEVICES")
                                   if spec.process else None)
        if native_only:
            others = [n for n in names if not cdi.is_native(n)]
            if others:
                raise RequestError(f"CDI device {others[0]!r}: a hook can serve NVIDIA's GPUs only; this needs "
                                   "the engine's CDI support or sandbox as the runtime")
        spec, warnings = cdi.apply(spec, names, [] if native_only else [*cdi.SPEC_DIRS, *cdi_dirs])
    request = gpu_request(spec, gpus, capabilities)
    if request is not None and max_capabilities:
        request = cap_request(request, max_capabilities)
    return spec, request, warnings
