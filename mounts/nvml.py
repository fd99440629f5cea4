"""The MIG questions no file of the driver's answers, asked of NVML.

Kubernetes' device plugin names MIG devices by the UUID NVML gives them (``MIG-<uuid>``), and
nvidia-container-cli's ``GPU:N`` counts a GPU's MIG devices in NVML's order; neither /proc
nor /dev shows either. Only for such a name, and only for the host's own driver (driver
root ``/``: a driver root elsewhere is a tree of files, not code to run as root), a forked
child with no_new_privs loads libnvidia-ml (as nvidia-container-cli does for every container)
and answers the parent GPU's minor and the GPU and compute instance ids over a pipe, within
TIMEOUT seconds. Everything else stays file-based.
"""

from __future__ import annotations

import os
import re
import select
import signal

from mounts.driver_facts import Inventory
from mounts.errors import RequestError
from mounts.ldcache import FLAG_REQUIRED_MASK

TIMEOUT = 10.0  # seconds: a GPU in a bad state can make nvmlInit hang
_SUCCESS = 0


def _library(inventory: Inventory) -> str:
    for lib in inventory.libraries:
        if lib.key == "libnvidia-ml.so.1" and lib.flags & FLAG_REQUIRED_MASK:
            return lib.path
    raise RequestError(f"{inventory.root}: no 64-bit libnvidia-ml.so.1 to look MIG devices up with")


def mig_lookup(inventory: Inventory, entry: str, busid: str | None = None, index: int = 0) -> tuple[int, int, int] | None:
    """(parent GPU's minor, GPU instance id, compute instance id) of the MIG device
    ``entry``: a ``MIG-<uuid>``, or (with ``busid``) the ``index``-th MIG device of that GPU.
    None when NVML knows no such device; NVML failing, hanging or absent is an error."""
    why = (f"{entry}: which MIG device this is only NVML knows, and NVML is asked only of the host's "
           "own driver (--driver-root /)")
    if inventory.root != "/":
        raise RequestError(f"{why}; name it as GPU:GI:CI or MIG-GPU-<uuid>/<gi>/<ci> instead")
    path = _library(inventory)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child answers on the pipe and exits
        code = 0
        try:
            os.close(r)
            import prctl

            prctl.set_no_new_privs(True)
            answer = _ask(path, entry, busid, index)
        except BaseException as e:  # noqa: BLE001 - every failure becomes the answer
            answer, code = f"error {e}", 1
        os.write(w, answer.encode(errors="replace")[:4000] + b"\n")
        os._exit(code)
    os.close(w)
    data = None
    try:
        ready, _, _ = select.select([r], [], [], TIMEOUT)
        data = os.read(r, 4096).decode(errors="replace").strip() if ready else None
    finally:
        os.close(r)
        if data is None:
            os.kill(pid, signal.SIGKILL)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if data is None:
        raise RequestError(f"{entry}: NVML ({path}) did not answer within {TIMEOUT:.0f} s")
    if data.startswith("error "):
        raise RequestError(f"{entry}: cannot look the MIG device up: NVML ({path}): {data[6:]}")
    if data == "none":
        return None
    if not re.fullmatch(r"[0-9]{1,9} [0-9]{1,9} [0-9]{1,9}", data):  # it died (a signal), or said nonsense
        raise RequestError(f"{entry}: cannot look the MIG device up: NVML ({path}) gave no answer "
                           f"(exit status {status})")
    minor, gi, ci = (int(x) for x in data.split())
    return minor, gi, ci


def _ask(path: str, entry: str, busid: str | None, index: int) -> str:  # pragma: no cover - in the child
    import ctypes

    nvml = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    rc = nvml.nvmlInit_v2()
    if rc != _SUCCESS:
        raise RuntimeError(nvml.nvmlErrorString(rc).decode(errors="replace"))
    try:
        gpu, mig = ctypes.c_void_p(), ctypes.c_void_p()
        minor, gi, ci = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        if busid is not None:
            if nvml.nvmlDeviceGetHandleByPciBusId_v2(busid.encode(), ctypes.byref(gpu)) != _SUCCESS:
                return "none"
            if nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, ctypes.c_uint(index), ctypes.byref(mig)) != _SUCCESS:
                return "none"
        else:
            if nvml.nvmlDeviceGetHandleByUUID(entry.encode(), ctypes.byref(mig)) != _SUCCESS:
                return "none"
            if nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, ctypes.byref(gpu)) != _SUCCESS:
                return "none"  # a whole GPU's UUID with a MIG- prefix
        if (nvml.nvmlDeviceGetMinorNumber(gpu, ctypes.byref(minor)) != _SUCCESS
                or nvml.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(gi)) != _SUCCESS
                or nvml.nvmlDeviceGetComputeInstanceId(mig, ctypes.byref(ci)) != _SUCCESS):
            return "none"
        return f"{minor.value} {gi.value} {ci.value}"
    finally:
        nvml.nvmlShutdown()
