"""The one question no file of the driver's answers: which MIG device a ``MIG-<uuid>`` is.

Kubernetes' device plugin names MIG devices by the UUID NVML gives them, and neither /proc nor
/dev shows it. Only for such a name, the driver root's own libnvidia-ml is loaded (as
nvidia-container-cli loads it for every container) and asked for the device's parent GPU
(by minor number) and its GPU and compute instance ids; everything else stays file-based.
"""

from __future__ import annotations

import ctypes

from mounts.driver import Gpu, Inventory
from mounts.errors import RequestError
from mounts.ldcache import FLAG_REQUIRED_MASK

_SUCCESS = 0


def _library(inventory: Inventory) -> str:
    for lib in inventory.libraries:
        if lib.key == "libnvidia-ml.so.1" and lib.flags & FLAG_REQUIRED_MASK:
            return lib.path
    raise RequestError(f"{inventory.root}: no 64-bit libnvidia-ml.so.1 to look MIG UUIDs up with")


def mig_by_uuid(inventory: Inventory, uuid: str) -> tuple[Gpu | None, int, int | None]:
    """(parent GPU, GPU instance id, compute instance id) of the MIG device ``uuid``; the
    GPU is None when NVML knows no such MIG device. NVML failing to start is an error."""
    path = _library(inventory)
    try:
        nvml = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise RequestError(f"{uuid}: cannot load {path} to look the MIG device up: {e}") from None
    nvml.nvmlErrorString.restype = ctypes.c_char_p

    def call(name: str, *args) -> int:
        return getattr(nvml, name)(*args)

    rc = call("nvmlInit_v2")
    if rc != _SUCCESS:
        raise RequestError(f"{uuid}: cannot look the MIG device up: NVML ({path}): "
                           f"{nvml.nvmlErrorString(rc).decode(errors='replace')}")
    try:
        handle, parent = ctypes.c_void_p(), ctypes.c_void_p()
        minor, gi, ci = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        if call("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(handle)) != _SUCCESS:
            return None, 0, None
        ok = (call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle, ctypes.byref(parent)) == _SUCCESS
              and call("nvmlDeviceGetMinorNumber", parent, ctypes.byref(minor)) == _SUCCESS
              and call("nvmlDeviceGetGpuInstanceId", handle, ctypes.byref(gi)) == _SUCCESS
              and call("nvmlDeviceGetComputeInstanceId", handle, ctypes.byref(ci)) == _SUCCESS)
        if not ok:  # a whole GPU's UUID with a MIG- prefix, or a device NVML cannot place
            return None, 0, None
        gpu = next((g for g in inventory.gpus if g.minor == minor.value), None)
        return gpu, gi.value, ci.value
    finally:
        call("nvmlShutdown")
