"""containerd's CRI plugin, run privately and driven as kubelet drives it: pods and their
containers through the CRI API's own gRPC service (runtime.v1), with two runtime handlers,
``runc`` and ``sandbox`` (containerd's runc shim, BinaryName our runtime). Used by
tests/integration/test_cri.py and scripts/bench/cri.py.

- ``stubs()``: Python gRPC stubs generated with grpcio-tools from the api.proto of Debian's
  ``golang-github-kubernetes-cri-api-dev`` (trixie; gogo.proto, which it imports, from
  ``golang-github-gogo-protobuf-dev``), fetched with ``apt-get download`` through a private
  apt configuration under ``.cache/apt-trixie`` (the machine's apt setup is left alone) and
  unpacked with ``dpkg -x``. Generated into ``.cache/``, never committed.
- ``pause_image()``: an OCI image layout tar holding only a static ``/pause`` (compiled here
  from a few lines of C), as registry.k8s.io/pause is; ``app_image()`` is the Debian fixture
  rootfs (fixtures.image_archive). Both are imported with ``ctr images import``: nothing is
  ever pulled (the CRI plugin's sandbox_image is our pause image).
- ``containerd_bin(version)``: the containerd to run, "1.6" (Debian bookworm's, installed by
  scripts/setup) or "1.7" (trixie's ``containerd`` package, 1.7.24, fetched like the CRI API
  above and unpacked with ``dpkg -x`` into ``.cache/``, never installed: its binaries need
  glibc 2.34, bookworm has 2.36). Its shim is the one found first on containerd's PATH: ours.
- ``CRI``: containerd with its own config.toml, root, state and sockets under a directory of
  ours, the cgroupfs driver (SystemdCgroup = false), host-network pods (no CNI), pod cgroups
  made and removed as kubelet's cgroupfs manager makes them, under a cgroup parent of ours.
  ``CRI(..., containerd="1.7", cdi_spec_dirs=[...])``: 1.7 with its own CDI injection
  (``enable_cdi``), from those directories. ``CRI(..., pod_network=True)``: pods may have a
  network namespace of their own (critest's), made by a CNI stand-in of ours
  (``STANDIN_CNI``: a veth pair whose both ends are in the pod's namespace, eth0 with an
  address; nothing on the host), the namespaces pinned under containerd's state.
  ``CRI(..., systemd=True)``: the systemd driver instead (SystemdCgroup = true for both
  handlers, so the shim runs them with --systemd-cgroup), for a host whose systemd is a
  private one (scripts/systemd-host): the pods' cgroup_parent is a slice name as kubelet's
  systemd manager gives it (``kubepods-besteffort-pod<uid>.slice``, made by systemd on demand
  when containerd's "slice:cri-containerd:<id>" scopes are started in it), stopped with
  systemctl at the pod's end; ``stop()`` stops ``kubepods.slice``.
  ``stop()`` removes every pod, ends containerd and whatever shim is left by pid, unmounts
  what is mounted under our directory, removes our cgroups and what containerd made under
  /run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixtures  # noqa: E402

from gofer import cgroups  # noqa: E402

REPO = fixtures.REPO
CACHE = fixtures.CACHE
SANDBOX = str(REPO / ".venv/bin/sandbox")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
CNI_LOOPBACK = "/usr/lib/cni/loopback"  # Debian's containernetworking-plugins (scripts/setup)
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images and containers in
PAUSE_IMAGE = "localhost/cri-pause:1"
APP_IMAGE = fixtures.IMAGE
HANDLERS = ("runc", "sandbox")
STUBS_REV = 1
CONTAINERD_REV = 1
CONTAINERDS = ("1.6", "1.7")
CRI_DEBS = ["golang-github-kubernetes-cri-api-dev", "golang-github-gogo-protobuf-dev"]
CRI_SUITE = "trixie"
GOCODE = "usr/share/gocode/src"
API_PROTO = "k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"

# kubelet's defaults for a container that is not privileged (k8s.io/kubernetes
# pkg/securitycontext: defaultMaskedPaths, defaultReadonlyPaths)
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                "/sys/firmware", "/sys/devices/virtual/powercap"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# --- the CRI API's stubs ----------------------------------------------------------------


def cri_api_source() -> Path:
    """The unpacked packages: ``<dir>/usr/share/gocode/src/k8s.io/cri-api/...``."""
    root = CACHE / f"cri-api-src-v{STUBS_REV}"
    if fixtures._done(root):
        return root
    tmp, debs = fixtures.unpacked_debs(root, CRI_DEBS, CRI_SUITE)
    version = subprocess.run(["dpkg-deb", "-f", next(debs.glob("golang-github-kubernetes-cri-api-dev_*.deb")),
                              "Version"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp / ".version").write_text(version + "\n")
    shutil.rmtree(debs)
    return fixtures._finish(tmp, root)


def stubs() -> Path:
    """A directory with api_pb2.py and api_pb2_grpc.py (and gogo's), for sys.path."""
    out = CACHE / f"cri-stubs-v{STUBS_REV}"
    if fixtures._done(out):
        return out
    src = cri_api_source() / GOCODE
    tmp = fixtures._fresh(out)
    proto_dir = (src / API_PROTO).parent
    fixtures.run(sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{proto_dir}",
                 f"--python_out={tmp}", f"--grpc_python_out={tmp}", "api.proto",
                 "github.com/gogo/protobuf/gogoproto/gogo.proto")
    return fixtures._finish(tmp, out)


def load_api():
    """(api_pb2, api_pb2_grpc), generated first if need be."""
    path = str(stubs())
    if path not in sys.path:
        sys.path.insert(0, path)
    import api_pb2
    import api_pb2_grpc

    return api_pb2, api_pb2_grpc


# --- containerd ------------------------------------------------------------------------


def containerd_17() -> Path:
    """trixie's containerd package (1.7) unpacked: ``<dir>/usr/bin/{containerd,ctr,containerd-shim-runc-v2}``."""
    root = CACHE / f"containerd-1.7-v{CONTAINERD_REV}"
    if fixtures._done(root):
        return root
    tmp, debs = fixtures.unpacked_debs(root, ["containerd"], CRI_SUITE)
    deb, = debs.glob("containerd_*.deb")
    shutil.rmtree(debs)
    version = subprocess.run([tmp / "usr/bin/containerd", "--version"], capture_output=True, text=True)
    if version.returncode != 0 or " 1.7." not in version.stdout:
        raise RuntimeError(f"{deb.name}: containerd --version: {version.stdout}{version.stderr}")
    return fixtures._finish(tmp, root)


def containerd_bin(version: str) -> Path:
    """The directory of containerd ``version``'s binaries (containerd, ctr, the runc shim)."""
    if version == "1.6":
        found = shutil.which("containerd")
        if found is None:
            raise FileNotFoundError("containerd is not installed (scripts/setup installs Debian's 1.6)")
        return Path(found).parent
    if version == "1.7":
        return containerd_17() / "usr/bin"
    raise ValueError(f"containerd {version!r}: one of {CONTAINERDS}")


# A CNI plugin of ours for pods with a network namespace of their own: loopback up and a veth
# pair whose both ends stay in the pod's namespace, eth0 holding an address made from the
# container id. Nothing is made on the host; the pod reaches no one (a pod IP that the host
# can reach would need a bridge or routes on the host).
STANDIN_CNI = r"""#!/bin/sh
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.0","0.3.1","0.4.0"]}'; exit 0;;
DEL|CHECK) exit 0;;
ADD) ;;
*) echo '{"code":4,"msg":"unknown CNI_COMMAND"}'; exit 1;;
esac
id=$(printf %s "$CNI_CONTAINERID" | tr -dc 0-9a-f)
ip=10.88.$(( 0x$(printf %s "$id" | cut -c1-2) )).$(( 0x$(printf %s "$id" | cut -c3-4) % 253 + 1 ))
nsenter --net="$CNI_NETNS" sh -c "ip link add $CNI_IFNAME type veth peer name peer0 &&
  ip addr add $ip/16 dev $CNI_IFNAME && ip link set peer0 up && ip link set $CNI_IFNAME up" >&2 ||
  { echo '{"code":11,"msg":"standin: could not make the interface"}'; exit 1; }
printf '{"cniVersion":"0.4.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"version":"4","address":"%s/16","interface":0}],"dns":{}}\n' \
  "$CNI_IFNAME" "$CNI_NETNS" "$ip"
"""


# --- images ------------------------------------------------------------------------------

PAUSE_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
/* The pod's infrastructure container, as Kubernetes' pause.c: waits for SIGINT or SIGTERM
 * and reaps every child the shared pid namespace gives it. */
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, 0);
    if (getpid() != 1) fprintf(stderr, "Warning: pause should be the first process\n");
    for (;;) pause();
}
"""
IMAGE_REV = 1


def _blob(blobs: dict[str, bytes], data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


@dataclasses.dataclass(frozen=True)
class HardLink:
    """An image file that is a hard link of another (``target``: its path in the layer)."""

    target: str


ImageFiles = dict[str, tuple[int, "bytes | str | HardLink | None"]]


def oci_archive(out: Path, name: str, files: ImageFiles, config: dict) -> Path:
    """An OCI image layout tar (oci-layout, index.json, blobs/sha256/...) of one uncompressed
    layer holding ``files`` (path -> (mode, content), None for a directory, a str for a
    symbolic link to it, a HardLink), owned by root, named ``name`` for ``ctr images import``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        # (hard links last: each after the file it links to)
        for path, (mode, content) in sorted(files.items(), key=lambda f: (isinstance(f[1][1], HardLink), f[0])):
            info = tarfile.TarInfo(path)
            info.mode, info.mtime = mode, 0
            if content is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                t.addfile(info)
            elif isinstance(content, HardLink):
                info.type, info.linkname = tarfile.LNKTYPE, content.target
                t.addfile(info)
            else:
                info.size = len(content)
                t.addfile(info, io.BytesIO(content))
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, layer.getvalue())
    config = {"architecture": "amd64", "os": "linux", **config,
              "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    config_desc = _blob(blobs, json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}]}
    manifest_desc = _blob(blobs, json.dumps(manifest).encode())
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
                            "platform": {"architecture": "amd64", "os": "linux"},
                            "annotations": {"io.containerd.image.name": name,
                                            "org.opencontainers.image.ref.name": name.rpartition(":")[2]}}]}
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, "w") as t:
        entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", json.dumps(index).encode())]
        entries += [("blobs/sha256/" + digest.partition(":")[2], data) for digest, data in blobs.items()]
        for arcname, data in entries:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    partial.rename(out)
    return out


def pause_binary() -> Path:
    out = CACHE / f"pause-v{IMAGE_REV}"
    if out.exists():
        return out
    src = CACHE / "pause.c"
    src.write_text(PAUSE_C)
    fixtures.run("gcc", "-static", "-O2", "-s", "-o", out.with_suffix(".partial"), src)
    src.unlink()
    out.with_suffix(".partial").rename(out)
    return out


PAUSE_DIRS_IMAGE = "localhost/cri-pause:dirs"


def pause_image(mount_points: bool = False) -> Path:
    """The pod's pause image: ``/pause`` alone, user 65535 (registry.k8s.io/pause's shape).
    With ``mount_points``, also empty /proc, /dev, /sys (a diagnostic variant, not kubelet's:
    named PAUSE_DIRS_IMAGE)."""
    out = CACHE / f"cri-pause{'-dirs' if mount_points else ''}-v{IMAGE_REV}.tar"
    if out.exists():
        return out
    files: ImageFiles = {"pause": (0o755, pause_binary().read_bytes())}
    if mount_points:
        files.update({d: (0o755, None) for d in ("proc", "dev", "sys")})
    return oci_archive(out, PAUSE_DIRS_IMAGE if mount_points else PAUSE_IMAGE, files,
                       {"config": {"Entrypoint": ["/pause"], "User": "65535:65535"}})


def app_image() -> Path:
    """The Debian fixture rootfs as an image (docker-archive tar), named APP_IMAGE."""
    return fixtures.image_archive()


# --- the private containerd --------------------------------------------------------------


class CRIError(Exception):
    """A CRI call that failed: the method, the gRPC code and containerd's message."""


def _cgroup_roots() -> list[Path]:
    """The cgroup hierarchies to make a pod's cgroup in: every v1 controller (and named
    hierarchy) mounted under /sys/fs/cgroup, as kubelet's cgroupfs manager does."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():  # pure v2: one tree
        return [root]
    return sorted(root / c for c in os.listdir(root) if (root / c).is_dir() and not (root / c).is_symlink())


def _host_pids_in(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        for sub in [d, *(p for p in d.rglob("*") if p.is_dir())] if d.is_dir() else []:
            try:
                pids |= {int(p) for p in (sub / "cgroup.procs").read_text().split()}
            except OSError:
                pass
    return pids


def _alive(pid: int) -> bool:
    """A process that is there and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2][0] != "Z"
    except OSError:
        return False


def _processes_matching(needle: bytes) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return out


def mounts_under(base: Path) -> list[str]:
    prefix = str(base).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix) or point == str(base):
                found.append(point)
    return found


class Pod:
    """A pod as kubelet keeps it: the sandbox id, the config it was run with (CreateContainer
    sends it again), its handler and cgroup."""

    def __init__(self, pod_id: str, config, handler: str, cgroup: str, uid: str):
        self.id, self.config, self.handler, self.cgroup, self.uid = pod_id, config, handler, cgroup, uid


class CRI:
    """containerd with its CRI plugin, private to ``base``; two runtime handlers (HANDLERS)."""

    def __init__(self, base: Path, driver_root: Path, trace: bool = True, pause_with_mount_points: bool = False,
                 systemd: bool = False, containerd: str = "1.6", cdi_spec_dirs: list[Path] | None = None,
                 pod_network: bool = False):
        self.edit_config = None  # a last change to config.toml before containerd reads it (path -> None)
        self.containerd = containerd  # "1.6" or "1.7" (CONTAINERDS)
        self.bin = containerd_bin(containerd)
        if cdi_spec_dirs is not None and containerd == "1.6":
            raise ValueError("containerd 1.6's CRI has no CDI injection (enable_cdi came with 1.7)")
        self.cdi_spec_dirs = cdi_spec_dirs  # containerd's own CDI injection, from these directories
        self.pod_network = pod_network  # pods with a network namespace of their own (STANDIN_CNI)
        self.base = Path(base)
        self.driver_root = Path(driver_root)
        self.trace = trace  # the sandbox wrapper keeps each failing call's argv and log
        self.pause_dirs = pause_with_mount_points
        self.pause_ref = PAUSE_DIRS_IMAGE if pause_with_mount_points else PAUSE_IMAGE
        self.sock = self.base / "containerd.sock"
        self.systemd = systemd  # the systemd cgroup driver (SystemdCgroup = true), kubelet's slices
        # (systemd: kubelet's top slice; every pod's slice nests in it by its dashes)
        self.cgroup_parent = "kubepods.slice" if systemd else f"/cri-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.pods: dict[str, Pod] = {}
        self.proc: subprocess.Popen | None = None
        self.api, self.grpc_api = load_api()
        self.base.mkdir(parents=True, exist_ok=True)

    # -- paths

    def runtime_root(self, handler: str) -> Path:
        """Where the handler's runtime keeps its state (the shim adds the namespace)."""
        return self.base / f"{handler}-root" / NAMESPACE

    @property
    def wrapper(self) -> Path:
        return self.base / "sandbox-runtime"

    @property
    def errors_log(self) -> Path:
        return self.base / "sandbox-errors.log"

    def log_tail(self, lines: int = 40, grep: str = "") -> str:
        try:
            text = (self.base / "containerd.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        if grep:
            text = [t for t in text if grep in t]
        return "\n".join(text[-lines:])

    def runtime_errors(self) -> str:
        return self.errors_log.read_text(errors="replace") if self.errors_log.exists() else ""

    # -- start, stop

    def _write_config(self) -> None:
        b = self.base
        dr = str(self.driver_root)
        if self.trace:
            # on failure: the call, the runtime's log.json, the bundle's config.json (the shim
            # removes the bundle), all under failed/
            body = ('log=; bundle=; prev=\nfor a in "$@"; do\n'
                    '  [ "$prev" = --log ] && log=$a; [ "$prev" = --bundle ] && bundle=$a; prev=$a\ndone\n'
                    f'"{SANDBOX}" --driver-root "{dr}" "$@"\nrc=$?\n'
                    'if [ "$rc" -ne 0 ]; then\n'
                    f'  {{ printf "rc=%s: sandbox %s\\n" "$rc" "$*"; [ -n "$log" ] && tail -n 5 "$log"; }} >>"{self.errors_log}" 2>/dev/null\n'
                    f'  [ -n "$bundle" ] && mkdir -p "{b}/failed" && cp "$bundle/config.json" "{b}/failed/$(basename "$bundle").json"\n'
                    'fi\nexit $rc\n')
        else:
            body = f'exec "{SANDBOX}" --driver-root "{dr}" "$@"\n'
        self.wrapper.write_text("#!/bin/sh\n# sandbox as containerd's runc shim runs it, on the fixture driver root\n" + body)
        self.wrapper.chmod(0o755)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runtimes = ""
        for name, binary in (("runc", RUNC), ("sandbox", str(self.wrapper))):
            runtimes += (f'[{cri}.containerd.runtimes.{name}]\n  runtime_type = "io.containerd.runc.v2"\n'
                         f'[{cri}.containerd.runtimes.{name}.options]\n  BinaryName = "{binary}"\n'
                         f'  Root = "{b}/{name}-root"\n  SystemdCgroup = {str(self.systemd).lower()}\n')
        extra = ""
        if self.cdi_spec_dirs is not None:
            extra += f'  enable_cdi = true\n  cdi_spec_dirs = {json.dumps([str(d) for d in self.cdi_spec_dirs])}\n'
        if self.pod_network:  # the pods' network namespaces pinned under our state, not /var/run/netns
            extra += '  netns_mounts_under_state_dir = true\n'
            (b / "cni/bin").mkdir(parents=True, exist_ok=True)
            (b / "cni/net.d").mkdir(parents=True, exist_ok=True)
            (b / "cni/bin/standin").write_text(STANDIN_CNI)
            (b / "cni/bin/standin").chmod(0o755)
            loopback = b / "cni/bin/loopback"  # containerd always adds a loopback network
            if not loopback.exists():
                loopback.symlink_to(CNI_LOOPBACK)
            (b / "cni/net.d/10-standin.conflist").write_text(json.dumps(
                {"cniVersion": "0.4.0", "name": "standin", "plugins": [{"type": "standin"}]}))
        (b / "config.toml").write_text(
            f'version = 2\nroot = "{b}/root"\nstate = "{b}/state"\n'
            'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
            ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",'
            ' "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]\n'
            f'[grpc]\n  address = "{self.sock}"\n[ttrpc]\n  address = "{self.sock}.ttrpc"\n'
            f'[debug]\n  address = "{b}/debug.sock"\n  level = "debug"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{b}/opt"\n'
            f'[{cri}]\n  sandbox_image = "{self.pause_ref}"\n'
            '  stream_server_address = "127.0.0.1"\n  stream_server_port = "0"\n'
            '  enable_selinux = false\n  restrict_oom_score_adj = true\n'
            + extra +
            f'[{cri}.containerd]\n  snapshotter = "overlayfs"\n  default_runtime_name = "runc"\n'
            f'  discard_unpacked_layers = false\n'
            + runtimes +
            f'[{cri}.cni]\n  bin_dir = "{b}/cni/bin"\n  conf_dir = "{b}/cni/net.d"\n'
            f'[{cri}.registry]\n  config_path = "{b}/certs.d"\n')

    def start(self) -> None:
        import grpc

        self.host_paths = {p: os.path.exists(p) for p in ("/run/containerd", "/var/lib/containerd", "/etc/cni",
                                                           "/opt/cni", "/var/log/pods", "/var/run/netns")}
        self._write_config()
        if self.edit_config is not None:
            self.edit_config(self.base / "config.toml")
        self.log = open(self.base / "containerd.log", "w")
        # the shim containerd starts is the first containerd-shim-runc-v2 on its PATH: its own
        env = dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', os.defpath)}")
        self.proc = subprocess.Popen([str(self.bin / "containerd"), "--config", str(self.base / "config.toml")],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        self.runtime = self.grpc_api.RuntimeServiceStub(self.channel)
        self.images = self.grpc_api.ImageServiceStub(self.channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.version = self.runtime.Version(self.api.VersionRequest(), timeout=2).runtime_version
                break
            except grpc.RpcError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("containerd did not start:\n" + self.log_tail()) from None
                time.sleep(0.1)
        for tar in (pause_image(self.pause_dirs), app_image()):
            r = self.ctr("images", "import", str(tar))
            if r.returncode != 0:
                raise RuntimeError(f"ctr images import {tar}: {r.stderr}")
        for ref in (self.pause_ref, APP_IMAGE):  # as kubelet checks before it would pull
            if not self.images.ImageStatus(self.api.ImageStatusRequest(image=self.api.ImageSpec(image=ref)),
                                           timeout=10).image.id:
                raise RuntimeError(f"the CRI does not see {ref} after the import")

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "ctr"), "-a", str(self.sock), "-n", NAMESPACE, *args], capture_output=True,
                              text=True, timeout=timeout)

    def stop(self) -> list[str]:
        """Remove every pod, end containerd and any shim or container process left (by pid),
        unmount what is mounted under our directory, remove our cgroups and what containerd
        made on the host. Returns what did not go cleanly (for the tests to report)."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                pods = self.runtime.ListPodSandbox(self.api.ListPodSandboxRequest(), timeout=30).items
            except Exception as e:  # noqa: BLE001 - keep cleaning
                pods = []
                problems.append(f"ListPodSandbox: {e}")
            for p in pods:
                for method in ("StopPodSandbox", "RemovePodSandbox"):
                    try:
                        getattr(self.runtime, method)(getattr(self.api, method + "Request")(pod_sandbox_id=p.id),
                                                      timeout=60)
                    except Exception as e:  # noqa: BLE001
                        details = e.details() if hasattr(e, "details") else str(e)
                        problems.append(f"{method} {p.id[:12]}: {details}")
            self.channel.close()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        shims = _processes_matching(f"-address {self.sock}".encode().replace(b" ", b"\0"))
        left = _host_pids_in(self._cgroup_dirs())
        if shims or left:
            problems.append(f"processes left: shims {shims}, in our cgroups {sorted(left)}")
        for pid in [*left, *shims]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in [*left, *shims]:
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        mounted = mounts_under(self.base)
        if mounted:
            problems.append(f"mounts left under {self.base}: {mounted}")
        for point in sorted(mounted, key=len, reverse=True):
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
        if self.systemd:  # the pods' slices (and any scope left in them), as systemd's units
            subprocess.run(["systemctl", "stop", self.cgroup_parent], capture_output=True, timeout=60)
        for d in self._cgroup_dirs():
            if d.is_dir():
                cgroups.remove_dirs([str(p) for p in d.rglob("*") if p.is_dir()] + [str(d)], patience=5)
        for path, existed in getattr(self, "host_paths", {}).items():
            if not existed and os.path.exists(path):
                shutil.rmtree(path, ignore_errors=True)
        for sub in ("root", "state", "opt"):  # the snapshots: big; the logs stay for a look
            shutil.rmtree(self.base / sub, ignore_errors=True)
        return problems

    def _cgroup_dirs(self) -> list[Path]:
        return [r / self._cgroup_path(self.cgroup_parent) for r in _cgroup_roots()]

    def _cgroup_path(self, parent: str) -> str:
        """A cgroup parent's path below a hierarchy's root (a slice's: by its dashes)."""
        if self.systemd:
            from gofer.systemd import expand_slice

            return expand_slice(parent).lstrip("/")
        return parent.lstrip("/")

    # -- the pod's cgroup, as kubelet's cgroupfs manager makes it

    def _make_cgroup(self, path: str) -> None:
        for root in _cgroup_roots():
            cur = root
            for part in path.strip("/").split("/"):
                parent, cur = cur, cur / part
                if not cur.is_dir():
                    cur.mkdir()
                    for f in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset takes no task
                        if (parent / f).exists():
                            (cur / f).write_text((parent / f).read_text())

    def remove_pod_cgroup(self, pod: Pod) -> list[str]:
        """Remove the pod's cgroup as kubelet does. systemd: its manager's Destroy, the slice
        unit stopped, then the slice's directories systemd left removed; returns those (runc's
        v1 systemd driver makes the scope's path itself in the controllers systemd does not
        manage: cpuset, freezer, cpuacct here)."""
        if not self.systemd:
            cgroups.remove_dirs([str(r / pod.cgroup.lstrip("/")) for r in _cgroup_roots()], patience=5)
            return []
        r = subprocess.run(["systemctl", "stop", pod.cgroup], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise OSError(f"systemctl stop {pod.cgroup}: {r.stderr.strip()}")
        left = [d for d in self.pod_cgroup_dirs(pod) if d.is_dir()]
        for d in left:
            cgroups.remove_dirs([str(p) for p in d.rglob("*") if p.is_dir()] + [str(d)], patience=5)
        return [str(d) for d in left]

    def pod_cgroup_dirs(self, pod: Pod) -> list[Path]:
        return [r / self._cgroup_path(pod.cgroup) for r in _cgroup_roots()]

    # -- the CRI, as kubelet calls it

    def call(self, method: str, request, timeout: float = 120, service: str = "runtime"):
        import grpc

        try:
            return getattr(getattr(self, service), method)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise CRIError(f"{method}: {e.code().name}: {e.details()}") from None

    def run_pod(self, name: str, handler: str, pid: str = "CONTAINER", network: str = "NODE") -> Pod:
        """RunPodSandbox of a host-network pod (``pid`` CONTAINER, or POD for
        shareProcessNamespace; ``network`` POD: a network namespace of its own, made by the
        CNI stand-in, with ``pod_network``), in a cgroup made first, as kubelet's."""
        a = self.api
        uid = str(uuid.uuid4())
        if self.systemd:  # kubelet's systemd name of a BestEffort pod's cgroup (its uid's dashes escaped)
            cgroup = f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
        else:
            cgroup = f"{self.cgroup_parent}/pod{uid}"
            self._make_cgroup(cgroup)
        logdir = self.base / "pods" / f"default_{name}_{uid}"
        logdir.mkdir(parents=True)
        ns = a.NamespaceOption(network=getattr(a, network), pid=getattr(a, pid), ipc=a.POD)
        config = a.PodSandboxConfig(
            metadata=a.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=0),
            log_directory=str(logdir),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default",
                    "io.kubernetes.pod.uid": uid},
            annotations={"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "now"},
            linux=a.LinuxPodSandboxConfig(
                cgroup_parent=cgroup,
                security_context=a.LinuxSandboxSecurityContext(
                    namespace_options=ns, seccomp=a.SecurityProfile(profile_type=a.SecurityProfile.RuntimeDefault))))
        try:
            pod_id = self.call("RunPodSandbox", a.RunPodSandboxRequest(config=config, runtime_handler=handler)).pod_sandbox_id
        except CRIError:
            if self.systemd:
                subprocess.run(["systemctl", "stop", cgroup], capture_output=True, timeout=60)
            else:
                cgroups.remove_dirs([str(r / cgroup.lstrip("/")) for r in _cgroup_roots()], patience=5)
            raise
        pod = Pod(pod_id, config, handler, cgroup, uid)
        self.pods[pod_id] = pod
        return pod

    def create_container(self, pod: Pod, name: str, command: list[str], env: dict[str, str] | None = None,
                         memory: int | None = None, image: str = APP_IMAGE, annotations: dict[str, str] | None = None,
                         cdi_devices: list[str] | None = None) -> str:
        """CreateContainer as kubelet sends it: the pod's namespaces, containerd's default
        seccomp profile, kubelet's masked and read-only paths, a termination-log mount, the
        resources of a pod with (``memory``) or without a limit; ``annotations`` added to
        kubelet's, ``cdi_devices`` the CDI names kubelet passes on from a device plugin's or
        DRA driver's allocation (the config's CDI_devices, CRI API 1.28+)."""
        a = self.api
        term = self.base / "kubelet/pods" / pod.uid / "containers" / name / uuid.uuid4().hex[:8]
        term.parent.mkdir(parents=True, exist_ok=True)
        term.touch()
        ns = pod.config.linux.security_context.namespace_options
        resources = a.LinuxContainerResources(cpu_period=100000, cpu_shares=2,
                                              oom_score_adj=1000 if memory is None else 900)
        if memory is not None:
            resources.memory_limit_in_bytes = memory
        config = a.ContainerConfig(
            metadata=a.ContainerMetadata(name=name, attempt=0),
            image=a.ImageSpec(image=image),
            command=command[:1], args=command[1:],
            envs=[a.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            mounts=[a.Mount(container_path="/dev/termination-log", host_path=str(term))],
            labels={"io.kubernetes.container.name": name, "io.kubernetes.pod.name": pod.config.metadata.name,
                    "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": pod.uid},
            annotations={"io.kubernetes.container.restartCount": "0",
                         "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                         **(annotations or {})},
            CDI_devices=[a.CDIDevice(name=n) for n in cdi_devices or ()],
            log_path=f"{name}/0.log",
            linux=a.LinuxContainerConfig(
                resources=resources,
                security_context=a.LinuxContainerSecurityContext(
                    namespace_options=a.NamespaceOption(network=ns.network, pid=ns.pid, ipc=ns.ipc),
                    seccomp=a.SecurityProfile(profile_type=a.SecurityProfile.RuntimeDefault),
                    masked_paths=MASKED_PATHS, readonly_paths=READONLY_PATHS)))
        return self.call("CreateContainer", a.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config)).container_id

    def start_container(self, cid: str) -> None:
        self.call("StartContainer", self.api.StartContainerRequest(container_id=cid))

    def run_container(self, pod: Pod, name: str, command: list[str], **kw) -> str:
        cid = self.create_container(pod, name, command, **kw)
        self.start_container(cid)
        return cid

    def status(self, cid: str, verbose: bool = False):
        return self.call("ContainerStatus", self.api.ContainerStatusRequest(container_id=cid, verbose=verbose))

    def container_info(self, cid: str) -> dict:
        """containerd's verbose info of a container: pid, runtimeSpec, snapshot..."""
        return json.loads(self.status(cid, verbose=True).info.get("info", "{}"))

    def pod_status(self, pod: Pod, verbose: bool = False):
        return self.call("PodSandboxStatus", self.api.PodSandboxStatusRequest(pod_sandbox_id=pod.id, verbose=verbose))

    def wait_exited(self, cid: str, timeout: float = 20):
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(cid).status
            if st.state == self.api.CONTAINER_EXITED or time.monotonic() > deadline:
                return st
            time.sleep(0.1)

    def stop_container(self, cid: str, timeout: int = 2) -> None:
        self.call("StopContainer", self.api.StopContainerRequest(container_id=cid, timeout=timeout))

    def remove_container(self, cid: str) -> None:
        self.call("RemoveContainer", self.api.RemoveContainerRequest(container_id=cid))

    def stop_pod(self, pod: Pod) -> None:
        self.call("StopPodSandbox", self.api.StopPodSandboxRequest(pod_sandbox_id=pod.id))

    def remove_pod(self, pod: Pod) -> None:
        self.call("RemovePodSandbox", self.api.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
        self.pods.pop(pod.id, None)

    def exec_sync(self, cid: str, cmd: list[str], timeout: int = 10):
        return self.call("ExecSync", self.api.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                         timeout=timeout + 30)

    def update_resources(self, cid: str, memory: int) -> None:
        a = self.api
        self.call("UpdateContainerResources", a.UpdateContainerResourcesRequest(
            container_id=cid, linux=a.LinuxContainerResources(cpu_period=100000, cpu_shares=2,
                                                               memory_limit_in_bytes=memory, oom_score_adj=900)))

    def teardown_pod(self, pod: Pod) -> list[str]:
        """kubelet's end of a pod: StopPodSandbox, RemovePodSandbox (which take its
        containers), then its cgroup. Returns the errors, for a finalizer to report."""
        errors = []
        for step in (self.stop_pod, self.remove_pod):
            try:
                step(pod)
            except CRIError as e:
                errors.append(str(e))
        try:
            self.remove_pod_cgroup(pod)
        except OSError as e:
            errors.append(f"pod cgroup: {e}")
        return errors

    def container_log(self, pod: Pod, name: str) -> str:
        """What the container wrote, out of the CRI's log file (its lines' content only)."""
        path = Path(pod.config.log_directory) / f"{name}/0.log"
        if not path.exists():
            return ""
        return "".join(line.split(" ", 3)[3] + ("\n" if line.split(" ", 3)[2] == "F" else "")
                       for line in path.read_text().splitlines() if line.count(" ") >= 3)


if __name__ == "__main__":  # set-up time: the stubs and containerd 1.7 (--stubs), else the images too
    print(stubs(), containerd_17(), sep="\n")
    if sys.argv[1:] != ["--stubs"]:
        print(pause_image(), pause_image(True), app_image(), sep="\n")
