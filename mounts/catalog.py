"""What the NVIDIA driver's files are, by capability: the names and places the toolkit's
users expect (nvidia-container-cli's lists). Discovery (mounts/driver.py) looks each one up
under the driver root; the plan (mounts/plan.py) picks the ones a request's capabilities
want."""

from __future__ import annotations

import re

# Library name prefixes per capability (matched against ld.so.cache keys).
LIBRARIES = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": ("libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
                "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so",
                "libnvidia-allocator.so", "libnvidia-compiler.so", "libnvidia-pkcs11.so",
                "libnvidia-pkcs11-openssl3.so", "libnvidia-nvvm.so"),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": ("libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so",
                 "libnvidia-glsi.so", "libnvidia-fbc.so", "libnvidia-ifr.so", "libnvidia-rtcore.so",
                 "libnvoptix.so", "libGLX_nvidia.so", "libEGL_nvidia.so", "libGLESv2_nvidia.so",
                 "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so", "libnvidia-cbl.so",
                 "libnvidia-egl-wayland.so", "libnvidia-egl-gbm.so", "libnvidia-egl-xcb.so",
                 "libnvidia-egl-xlib.so"),
    "ngx": ("libnvidia-ngx.so",),
}
# NVIDIA's EGL external platform libraries: versioned on their own (egl-wayland 1.1.10,
# egl-gbm 1.1.0), not with the driver, so taken by SONAME.
EGL_PLATFORM_LIBS = ("libnvidia-egl-wayland.so.1", "libnvidia-egl-gbm.so.1", "libnvidia-egl-xcb.so.1",
                     "libnvidia-egl-xlib.so.1")
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
# Where the driver's binaries are looked for, after the directories beside its libraries
# (<libdir>/../bin: /usr/local/nvidia/bin) and, for the host's own root, its PATH: the
# standard directories (nvidia-ctk's, Debian's first). Only an ELF executable is taken.
BIN_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "bin", "sbin")
# Where a driver root without an ld.so.cache entry for the driver keeps its libraries (GKE's
# /home/kubernetes/bin/nvidia/lib64, an installer's /usr/lib64 ...), after those its
# etc/ld.so.conf names: searched as ldconfig would, each file's SONAME read from its ELF
# header. Each directory once (lib and usr/lib are often one).
LIB_DIRS = ("lib64", "lib", "usr/lib64", "usr/lib", "usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu",
            "usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu", "usr/local/lib64", "usr/local/lib",
            "lib32", "usr/lib32", "usr/lib/i386-linux-gnu", "lib/i386-linux-gnu")
# GSP firmware, where the kernel looks for it (drivers/base/firmware_loader, and nvidia-ctk in
# this order): the path in firmware_class's parameter (read under the device root), then these,
# each + nvidia/<version>/gsp*.bin. {release}: the device root's kernel release.
FIRMWARE_PARAM = "sys/module/firmware_class/parameters/path"
FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                 "/lib/firmware")
IPC = {
    "utility": ("/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket"),
    "compute": ("/tmp/nvidia-mps",),
}
# The loaders' configuration files, by capability: where a host keeps them (Debian's layout
# first, then /etc's), bound at the same path. Each names its library by SONAME (Debian's
# do), which the container's ld.so.cache resolves: nothing in them needs rewriting.
CONFIGS = {
    "graphics": ("/usr/share/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json",
                 "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
                 "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/glvnd/egl_vendor.d/10_nvidia.json",
                 "/usr/share/nvidia/nvoptix.bin"),
    "compute": ("/etc/OpenCL/vendors/nvidia.icd",),
}
# EGL's external platform directories (graphics): every file of NVIDIA's there is bound.
EGL_PLATFORMS = ("/usr/share/egl/egl_external_platform.d", "/etc/egl/egl_external_platform.d")
PLATFORM_FILE = re.compile(r"[A-Za-z0-9_.+-]{0,100}nvidia[A-Za-z0-9_.+-]{0,100}\.json")  # (never a "::")
# Xorg's driver and GLX modules (display): where Xorg looks (lib64 distributions' too), then
# Debian's flavour directories (XORG_FLAVOURS/<flavour>/<name>: current, tesla, tesla-535 ...,
# which its alternatives link the first to). Bound where Xorg looks on Debian.
XORG_MODULES = (
    ("/usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib64/xorg/modules/drivers/nvidia_drv.so"),
    ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
     "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}"),
)
XORG_FLAVOURS = "/usr/lib/nvidia"
# Extra links nvidia-container-cli creates: (capability, link name, what it points to)
EXTRA_LINKS = (
    ("compute", "libcuda.so", "libcuda.so.1"),
    ("graphics", "libGLX_indirect.so.0", "libGLX_nvidia.so.{version}"),
    ("video", "libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
)
