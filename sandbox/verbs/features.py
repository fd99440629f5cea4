"""``sandbox features``: what this runtime supports, as the runtime-spec's features JSON."""

from __future__ import annotations

import sys

import msgspec

from mounts import OCI_VERSION


def main(args) -> int:
    from gofer import process
    from gofer.rootfs import FLAGS, PROPAGATION
    from gofer.syscalls import NAMESPACES
    from mounts.spec import CAP_NUMBERS, SECCOMP_ACTIONS, SECCOMP_OPS

    features = {
        "ociVersionMin": "1.0.0",
        "ociVersionMax": OCI_VERSION,
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": sorted(set(FLAGS) | set(PROPAGATION)),
        "linux": {
            "namespaces": sorted(NAMESPACES),
            "capabilities": sorted(CAP_NUMBERS),
            "cgroup": {"v1": True, "v2": True, "systemd": True, "systemdUser": False},
            "seccomp": {"enabled": True, "actions": list(SECCOMP_ACTIONS),
                        "operators": list(SECCOMP_OPS), "archs": ["SCMP_ARCH_X86", "SCMP_ARCH_X86_64",
                                                                  "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64"]},
            "apparmor": {"enabled": process.apparmor()},  # applied where the kernel has it
            "selinux": {"enabled": process.selinux()},
        },
        "annotations": {"org.gpu-sandbox.nvidia": "native: NVIDIA_* requests, linux.devices and the "
                        "NVIDIA hooks are served in-process"},
    }
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(features).decode(), indent=2) + "\n")
    return 0
