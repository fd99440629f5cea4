"""Which GPUs and MIG devices a request names, among those the inventory has: indices,
GPU-UUIDs, PCI bus ids, and the MIG devices' names. Pure, but for the MIG names only NVML
knows (``MIG-<uuid>`` and ``GPU:N``): those ask the driver (mounts/nvml.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

from mounts.driver_facts import Gpu, Inventory, Mig
from mounts.errors import RequestError
from mounts.request import GpuRequest


def select_gpus(request: GpuRequest, inventory: Inventory) -> list[Gpu]:
    """The whole GPUs ``request.devices`` names: indices, GPU-UUIDs, PCI bus ids (MIG
    devices are select_migs'); any unknown entry is an error."""
    if request.devices == ("all",):
        return list(inventory.gpus)
    by_minor = request.source == "linux.devices"
    return _pick(request, [e for e in request.devices if not is_mig(e)],
                 lambda e: _find_gpu(e, inventory.gpus, by_minor), "device", f"{len(inventory.gpus)} GPUs",
                 inventory.dev_root)


def _pick(request: GpuRequest, entries: list[str], find: Callable, what: str, have: str, where: str) -> list:
    """What each entry names (once each, in order); one that names nothing is an error."""
    chosen = []
    for entry in entries:
        found = find(entry)
        if found is None:
            raise RequestError(f"{request.source}: unknown {what} {entry!r} ({have} under {where})")
        if found not in chosen:
            chosen.append(found)
    return chosen


_INDEX = re.compile(r"[0-9]{1,9}")  # ASCII only: int() would take "١", "０" and "²" too
_BUSID = re.compile(r"([0-9a-f]{1,8}):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


def _norm_busid(busid: str) -> str | None:
    """A PCI bus id with its domain widened to 8 digits (0000:3b:00.0 -> 00000000:3b:00.0)."""
    m = _BUSID.fullmatch(busid.lower())
    return f"{int(m.group(1), 16):08x}:{m.group(2)}" if m else None


def _find_gpu(entry: str, gpus: list[Gpu], by_minor: bool) -> Gpu | None:
    index = int(entry) if _INDEX.fullmatch(entry) else None
    busid = _norm_busid(entry) if entry.count(":") == 2 else None
    for g in gpus:
        if index is not None and index == (g.minor if by_minor else g.index):
            return g
        if entry.upper().startswith("GPU-") and entry.lower() == g.uuid.lower():
            return g
        if busid is not None and busid == _norm_busid(g.busid):
            return g
    return None


_MIG_INDEX = re.compile(r"([0-9]{1,9}):([0-9]{1,4})")  # nvidia-container-cli's GPU:MIG-device-index
_MIG_IDS = re.compile(r"([0-9]{1,9}):([0-9]{1,4}):([0-9]{1,4})")  # ours: GPU:GI:CI
_MIG_LEGACY = re.compile(r"MIG-(GPU-[0-9a-fA-F-]{1,64})/([0-9]{1,4})/([0-9]{1,4})")


def is_mig(entry: str) -> bool:
    return entry.startswith("MIG-") or bool(_MIG_INDEX.fullmatch(entry) or _MIG_IDS.fullmatch(entry))


def select_migs(request: GpuRequest, inventory: Inventory) -> list[Mig]:
    """The MIG devices ``request.devices`` names: ``GPU:GI:CI`` (the GPU's index, then the
    instance ids) and ``MIG-GPU-<uuid>/<gi>/<ci>`` from the driver's files; ``MIG-<uuid>`` and
    ``GPU:N`` (the N-th MIG device in NVML's order, as nvidia-container-cli counts them) from
    NVML (mounts/nvml.py). A name that matches no MIG device is an error. ``all`` means
    whole GPUs, never MIG devices."""
    entries = [e for e in request.devices if is_mig(e)] if request.devices != ("all",) else []
    return _pick(request, entries, lambda e: _find_mig(e, inventory), "MIG device",
                 f"{len(inventory.migs)} MIG devices", inventory.dev_root)


def _find_mig(entry: str, inventory: Inventory) -> Mig | None:
    if m := _MIG_IDS.fullmatch(entry):
        gpu = next((g for g in inventory.gpus if g.index == int(m.group(1))), None)
        where = (gpu.minor, int(m.group(2)), int(m.group(3))) if gpu else None
    elif m := _MIG_LEGACY.fullmatch(entry):
        gpu = next((g for g in inventory.gpus if g.uuid.lower() == m.group(1).lower()), None)
        where = (gpu.minor, int(m.group(2)), int(m.group(3))) if gpu else None
    else:
        from mounts.nvml import mig_lookup

        if m := _MIG_INDEX.fullmatch(entry):
            gpu = next((g for g in inventory.gpus if g.index == int(m.group(1))), None)
            where = mig_lookup(inventory, entry, gpu.busid, int(m.group(2))) if gpu else None
        else:
            where = mig_lookup(inventory, entry)
    return next((x for x in inventory.migs if (x.minor, x.gi, x.ci) == where), None)
