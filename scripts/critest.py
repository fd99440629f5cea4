#!/usr/bin/env python3
"""critest, Kubernetes' CRI validation suite (cri-tools v1.26.1), against one private
containerd (scripts/cri.py) with both runtime handlers, ``runc`` and ``sandbox``, every
spec's result side by side and the difference: what runc passes and sandbox fails is what
counts (the rest is this setup's, alike for both).

  .venv/bin/python scripts/critest.py --cri-tools DIR [--containerd 1.7] [--focus RE] [--all]

Needs root. The pieces, each made once and cached under .cache/:

- Go 1.23: bookworm-backports' ``golang-1.23-go`` and ``golang-1.23-src``, fetched through
  the private apt configuration (fixtures.apt_options) and unpacked with ``dpkg -x``.
- critest: built from cri-tools' source (``--cri-tools``: a git directory holding the tag
  v1.26.1, or that release's tree) in a temp dir, removed after: ``go test -c ./cmd/critest``
  as its Makefile does, offline (GOFLAGS=-mod=vendor, GOPROXY=off: cri-tools vendors its
  dependencies), HOME and the Go caches in the temp dir too (Go's telemetry writes under
  HOME). Only the binary is kept.
- The images, made here: nothing is pulled. critest names its images by registry
  (registry.k8s.io/e2e-test-images/busybox:1.29-2 and the like, framework/util.go and
  validate/consts.go); each is made under that name from Debian's busybox (bookworm's, with
  the host's glibc) as cri-tools' own Dockerfiles make them from busybox
  (images/: the user and group images), nginx and httpd as busybox's httpd serving a page
  (the httpd one first prints the command line Apache logs), and imported with ``ctr images
  import`` as the CRI tests import theirs. What critest pulls on purpose (the Image Manager
  specs) cannot work without a registry, for either handler.
- containerd: a private one (cri.CRI) with the CNI stand-in (pods get a network namespace of
  their own: a veth pair inside it, nothing on the host, so a pod's IP is not reachable from
  the host), run in a mount namespace of this script's whose root is made rshared as on a
  systemd host (the mount propagation specs bind-mount from the host's side): nothing any
  spec mounts outlives the run.

By default the specs that cannot pass in this setup for either handler are skipped (SKIP:
a registry, a pod IP the host reaches, host ports); ``--all`` runs them too. The two runs
are one after the other on the same containerd (the specs use fixed host ports).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import cri  # noqa: E402
import fixtures  # noqa: E402

from gofer import cgroups  # noqa: E402

CACHE = fixtures.CACHE
CRI_TOOLS_TAG = "v1.26.1"
GO_DEBS = ["golang-1.23-go", "golang-1.23-src"]
GO_SUITE = "bookworm-backports"
GO_REV = 1
CRITEST_REV = 1
IMAGES_REV = 3

E2E = "registry.k8s.io/e2e-test-images/"
CRI_TOOLS_IMAGES = "gcr.io/k8s-staging-cri-tools/"

# Specs that cannot pass here, whatever the handler: they pull from a registry, reach a
# pod's IP from the host, or need host ports mapped (CNI's portmap: the host's netfilter).
SKIP = [
    r"Image Manager",
    r"port mapping",
    r"should support network$",  # Multiple Containers: GET of the pod's IP from the host
    r"should support portforward \[Conformance\]",  # the same, before its port forward
]


def say(what: str) -> None:
    print(f"critest: {what}", file=sys.stderr, flush=True)


# --- Go and critest ----------------------------------------------------------------------


def go_root() -> Path:
    """GOROOT of bookworm-backports' Go 1.23, unpacked."""
    root = CACHE / f"go-1.23-v{GO_REV}"
    if not fixtures._done(root):
        say("fetching Go 1.23 (bookworm-backports)")
        tmp, debs = fixtures.unpacked_debs(root, GO_DEBS, GO_SUITE)
        shutil.rmtree(debs)
        fixtures._finish(tmp, root)
    goroot = root / "usr/lib/go-1.23"
    if not (goroot / "bin/go").exists():
        raise SystemExit(f"critest: no usr/lib/go-1.23/bin/go in {root}")
    return goroot


def _export_source(source: Path, dest: Path) -> None:
    """cri-tools v1.26.1's tree into ``dest``: from a git directory (``git archive`` of the
    tag), or copied from a tree of that release."""
    git_dir = source / ".git" if (source / ".git").exists() else source
    if (git_dir / "objects").is_dir():
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", CRI_TOOLS_TAG],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise SystemExit(f"critest: {source}: git archive {CRI_TOOLS_TAG}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    elif (source / "cmd/critest").is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
    else:
        raise SystemExit(f"critest: {source} is neither a git directory of cri-tools nor its tree")
    if not (dest / "vendor/modules.txt").exists():
        raise SystemExit(f"critest: {source}: no vendor/ (cri-tools {CRI_TOOLS_TAG} vendors its dependencies)")


def critest_binary(source: Path | None) -> Path:
    """critest, built once from ``source`` in a temp dir (cached under .cache/)."""
    out = CACHE / f"critest-{CRI_TOOLS_TAG}-v{CRITEST_REV}" / "critest"
    if out.exists():
        return out
    if source is None:
        raise SystemExit("critest: not built yet: --cri-tools DIR (a git directory of kubernetes-sigs/cri-tools "
                         f"holding {CRI_TOOLS_TAG}, or that release's source tree)")
    goroot = go_root()
    tmp = Path(tempfile.mkdtemp(prefix="critest-build-"))
    try:
        src = tmp / "src"
        src.mkdir()
        _export_source(source, src)
        env = {"PATH": f"{goroot}/bin:/usr/bin:/bin", "GOROOT": str(goroot), "HOME": str(tmp / "home"),
               "XDG_CONFIG_HOME": str(tmp / "home/.config"), "GOCACHE": str(tmp / "cache"),
               "GOPATH": str(tmp / "gopath"), "GOTMPDIR": "", "GOFLAGS": "-mod=vendor", "GOPROXY": "off",
               "GOTOOLCHAIN": "local", "GOTELEMETRY": "off", "CGO_ENABLED": "0"}
        say(f"building critest {CRI_TOOLS_TAG} with {goroot.name} (a few minutes)")
        partial = out.with_suffix(".partial")
        out.parent.mkdir(parents=True, exist_ok=True)
        ldflags = f"-X github.com/kubernetes-sigs/cri-tools/pkg/version.Version={CRI_TOOLS_TAG.lstrip('v')}"
        r = subprocess.run(["go", "test", "-c", "-o", str(partial), "-trimpath", "-ldflags", ldflags,
                            "./cmd/critest"], cwd=src, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"critest: go test -c failed:\n{r.stdout}{r.stderr}")
        partial.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --- images ------------------------------------------------------------------------------

PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
GROUP = """root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
www-data:x:33:
operator:x:37:
staff:x:50:
users:x:100:
nogroup:x:65534:
"""

# What busybox 1.29's image has and Debian's busybox lacks, as scripts of its applets
PGREP = r"""#!/bin/sh
# pgrep PATTERN: the pids whose name matches (Debian's busybox has no pgrep)
found=1
for d in /proc/[0-9]*; do
  read -r name < "$d/comm" 2>/dev/null || continue
  if echo "$name" | grep -q -e "$1"; then echo "${d#/proc/}"; found=0; fi
done
exit $found
"""
IPCS = r"""#!/bin/sh
# ipcs -m: this IPC namespace's shared memory segments (Debian's busybox has no ipcs)
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size cpid lpid nattch uid rest; do
  printf '0x%08x %-10s %-10s %-10s %-10s %s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
"""

# nginx as critest's specs see it (images/hostnet-nginx, e2e-test-images/nginx): pid 1 of its
# container titled "nginx: master process ..." (ContainerPID, PodPID), named nginx (pidof,
# HostPID), its pid in /var/run/nginx.pid, a worker serving the page (busybox's httpd).
NGINX_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static pid_t worker;
static void pass(int sig) { if (worker > 0) kill(worker, sig); }
int main(int argc, char **argv) {
    const char *title = "nginx: master process nginx -g daemon off;";
    if (strcmp(argv[0], title) != 0) {  /* the title in /proc/PID/cmdline, the name stays nginx */
        char *again[] = {(char *)title, 0};
        execv("/usr/sbin/nginx", again);
        perror("execv /usr/sbin/nginx");
        return 1;
    }
    FILE *f = fopen("/var/run/nginx.pid", "w");
    if (!f) { perror("/var/run/nginx.pid"); return 1; }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    signal(SIGTERM, pass); signal(SIGINT, pass); signal(SIGQUIT, pass);
    worker = fork();
    if (worker == 0) {
        execl("/bin/busybox", "httpd", "-f", "-v", "-p", PORT, "-h", "/usr/share/nginx/html", (char *)0);
        perror("execl /bin/busybox");
        _exit(1);
    }
    int status = 0;
    while (waitpid(worker, &status, 0) < 0) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
"""
# e2e-test-images/nonewprivs: a setuid-root program that prints its effective uid
NNP_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", (int)geteuid()); return 0; }
"""


def busybox() -> Path:
    """Debian's busybox (bookworm's ``busybox``, unpacked): the one built without the
    standalone shell. busybox-static's ash runs its applets in-process, never exec'ing
    /bin/ls, so a masked /bin/ls would go unnoticed (MaskedPaths); busybox 1.29's image
    execs them, as this one does."""
    root = CACHE / "busybox-v1"
    if not fixtures._done(root):
        tmp = fixtures._fresh(root)
        debs = tmp / "debs"
        debs.mkdir()
        opts = fixtures.apt_options()
        fixtures.run("apt-get", *opts, "update")
        fixtures.run("apt-get", *opts, "download", "busybox", cwd=debs)
        deb, = debs.glob("busybox_*.deb")
        fixtures.run("dpkg", "-x", deb, tmp)
        shutil.rmtree(debs)
        fixtures._finish(tmp, root)
    return root / "bin/busybox"


# what Debian's busybox links to, copied from the host (as fixtures.rootfs does)
GLIBC = ["ld-linux-x86-64.so.2", "libc.so.6", "libresolv.so.2"]


def _static(source: str, work: Path, name: str, *defines: str) -> bytes:
    (work / f"{name}.c").write_text(source)
    fixtures.run("gcc", "-static", "-O2", "-s", *defines, "-o", work / name, work / f"{name}.c")
    return (work / name).read_bytes()


def _dirs(files: cri.ImageFiles, *paths: str) -> None:
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            files.setdefault("/".join(parts[:i]), (0o755, None))


def _busybox_files(passwd: str = PASSWD, group: str = GROUP) -> cri.ImageFiles:
    """busybox's image: /bin/busybox, every applet a hard link of it (as there: masking
    /bin/ls must leave /bin/sh alone), pgrep and ipcs, /etc/passwd and group; glibc."""
    binary = busybox()
    applets = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    files: cri.ImageFiles = {}
    libdir = "lib/x86_64-linux-gnu"
    _dirs(files, "bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home", "var/www", "var/run", "proc", "sys",
          "dev", libdir, "lib64")
    files["tmp"] = (0o1777, None)
    for lib in GLIBC:
        files[f"{libdir}/{lib}"] = (0o755, (Path("/lib/x86_64-linux-gnu") / lib).read_bytes())
    files["lib64/ld-linux-x86-64.so.2"] = (0o777, f"/{libdir}/ld-linux-x86-64.so.2")
    files["bin/busybox"] = (0o755, binary.read_bytes())
    for applet in applets:
        if applet != "bin/busybox":
            files[applet] = (0o755, cri.HardLink("bin/busybox"))
    files["usr/bin/pgrep"] = (0o755, PGREP.encode())
    files["usr/bin/ipcs"] = (0o755, IPCS.encode())
    files["etc/passwd"] = (0o644, passwd.encode())
    files["etc/group"] = (0o644, group.encode())
    return files


def _page(files: cri.ImageFiles, root: str) -> cri.ImageFiles:
    files = dict(files)
    _dirs(files, root)
    files[f"{root.strip('/')}/index.html"] = (0o644, b"<html><body>Welcome</body></html>\n")
    return files


def images() -> list[Path]:
    """The OCI archives of every image critest's runtime specs use, named as critest names them."""
    out_dir = CACHE / f"critest-images-v{IMAGES_REV}"
    if fixtures._done(out_dir):
        return sorted(out_dir.glob("*.tar"))
    tmp = fixtures._fresh(out_dir)
    work = tmp / "build"
    work.mkdir()
    base = _busybox_files()
    shell = {"config": {"Cmd": ["sh"]}}
    made: list[tuple[str, cri.ImageFiles, dict]] = [(E2E + "busybox:1.29-2", base, shell)]
    for name, port in ((E2E + "nginx:1.14-2", 80), (CRI_TOOLS_IMAGES + "hostnet-nginx-amd64:latest", 12003)):
        files = _page(base, "/usr/share/nginx/html")
        files["usr/sbin/nginx"] = (0o755, _static(NGINX_C, work, "nginx", f'-DPORT="{port}"'))
        made.append((name, files, {"config": {"Cmd": ["nginx", "-g", "daemon off;"]}}))
    # Apache's image logs its command line first; the multi-container spec looks for it
    httpd = ["sh", "-c", "echo \"AH00094: Command line: 'httpd -D FOREGROUND'\"; "
             "exec httpd -f -v -p 80 -h /usr/local/apache2/htdocs"]
    made.append((E2E + "httpd:2.4.39-4", _page(base, "/usr/local/apache2/htdocs"), {"config": {"Cmd": httpd}}))
    nnp = dict(base)
    _dirs(nnp, "usr/local/bin")
    nnp["usr/local/bin/nnp"] = (0o4755, _static(NNP_C, work, "nnp"))
    made.append((E2E + "nonewprivs:1.3", nnp, {"config": {"Entrypoint": ["/usr/local/bin/nnp"]}}))
    # images/build's IMAGE_USERS
    for name, user in (("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1004"), ("test-image-user-username-group", "www-data:1004")):
        made.append((CRI_TOOLS_IMAGES + name + ":latest", base, {"config": {"Cmd": ["sh"], "User": user}}))
    # images/image-predefined-group/Dockerfile: default-user 1000, in group-defined-in-image 50000
    grouped = _busybox_files(PASSWD + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n",
                             GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")
    _dirs(grouped, "home/default-user")
    made.append((CRI_TOOLS_IMAGES + "test-image-predefined-group:latest", grouped,
                 {"config": {"Cmd": ["sh"], "User": "1000"}}))
    for i, (name, files, config) in enumerate(made):
        cri.oci_archive(tmp / f"{i:02d}.tar", name, files, config)
    shutil.rmtree(work)
    fixtures._finish(tmp, out_dir)
    return sorted(out_dir.glob("*.tar"))


# --- the runs ----------------------------------------------------------------------------


def _spec_name(report: dict) -> str:
    return " ".join([*(report.get("ContainerHierarchyTexts") or []), report.get("LeafNodeText", "")]).strip()


TEARDOWN = ("StopPodSandbox", "RemovePodSandbox", "StopContainer", "RemoveContainer")


def _when(stamp: str) -> datetime.datetime:
    """An RFC 3339 time of Go's (nanoseconds, Z or an offset), to the microsecond."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    frac = (m.group(2) or ".0")[:7]
    return datetime.datetime.fromisoformat(m.group(1) + frac + ("+00:00" if m.group(3) == "Z" else m.group(3)))


def teardown_errors(containerd_log: str, reports: dict[str, dict]) -> list[str]:
    """containerd's failed teardown calls in a stretch of its log, each with the spec that was
    running: critest's AfterEach ignores their errors, so no spec fails for them, yet kubelet
    would retry such a pod forever."""
    spans = [(_when(r["StartTime"]), _when(r["EndTime"]), name) for name, r in reports.items()
             if r.get("StartTime") and r.get("EndTime")]
    found = []
    for line in containerd_log.splitlines():
        # (NotFound: a pod the spec removed itself, stopped again by its AfterEach)
        if ("level=error" in line and any(f'msg="{call} for' in line for call in TEARDOWN)
                and "code = NotFound" not in line):
            stamp = re.match(r'time="([^"]+)"', line)
            when = _when(stamp.group(1)) if stamp else None
            spec = next((name for start, end, name in spans if when and start <= when <= end), "(between specs)")
            msg = re.sub(r"([0-9a-f]{12})[0-9a-f]{52}", r"\1", line.partition('msg="')[2].replace('\\"', '"'))
            found.append(f"{spec}: {msg[:600]}")
    return found


def run_critest(binary: Path, c: cri.CRI, handler: str, out: Path, focus: list[str], skip: list[str],
                timeout: float) -> tuple[dict[str, dict], list[str]]:
    """critest with ``handler``: ({spec: its report}, containerd's teardown errors meanwhile);
    its output in ``out``.log."""
    log_path = c.base / "containerd.log"
    log_start = log_path.stat().st_size
    endpoint = f"unix://{c.sock}"
    args = [str(binary), f"--runtime-endpoint={endpoint}", f"--image-endpoint={endpoint}",
            f"--runtime-handler={handler}", f"--ginkgo.json-report={out}.json", "--ginkgo.no-color",
            "--ginkgo.timeout=2h"]
    args += [f"--ginkgo.focus={f}" for f in focus] + [f"--ginkgo.skip={s}" for s in skip]
    say(f"critest --runtime-handler={handler} (output: {out}.log)")
    start = time.monotonic()
    with open(f"{out}.log", "w") as log:
        # from a directory of its own: critest writes its temp files and logs where it is told
        subprocess.run(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                       cwd=out.parent)
    say(f"{handler}: {time.monotonic() - start:.0f} s")
    results: dict[str, dict] = {}
    report_file = Path(f"{out}.json")
    if not report_file.exists():
        raise SystemExit(f"critest: no report from the {handler} run; see {out}.log")
    for suite in json.loads(report_file.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") == "It":
                results[_spec_name(spec)] = spec
    with open(log_path, errors="replace") as f:
        f.seek(log_start)
        return results, teardown_errors(f.read(), results)


def _first_line(report: dict) -> str:
    message = (report.get("Failure") or {}).get("Message", "")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " / ".join(lines[:3])[:400]


def table(results: dict[str, dict[str, dict]]) -> str:
    """The specs, runc's result and sandbox's, those that differ marked."""
    handlers = list(results)
    names = sorted(set().union(*(r.keys() for r in results.values())))
    width = max(len(n) for n in names) if names else 10
    lines = [f"{'spec':<{width}}  " + "  ".join(f"{h:<8}" for h in handlers)]
    counts = {h: {} for h in handlers}
    for name in names:
        states = [results[h].get(name, {}).get("State", "-") for h in handlers]
        for h, s in zip(handlers, states, strict=True):
            counts[h][s] = counts[h].get(s, 0) + 1
        mark = "  <<" if len(set(states)) > 1 else ""
        lines.append(f"{name:<{width}}  " + "  ".join(f"{s:<8}" for s in states) + mark)
    lines.append("")
    for h in handlers:
        lines.append(f"{h}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts[h].items())))
    return "\n".join(lines)


def differences(results: dict[str, dict[str, dict]], first: str, second: str) -> list[str]:
    """The specs ``first`` passes and ``second`` does not, each with its failure's message."""
    out = []
    for name, report in sorted(results[first].items()):
        other = results[second].get(name)
        if report.get("State") == "passed" and other is not None and other.get("State") != "passed":
            out.append(f"- {name}: {other.get('State')}: {_first_line(other)}")
    return out


def _cgroup_dirs(name: str) -> dict[Path, bool]:
    """/sys/fs/cgroup/*/NAME (where containerd's default cgroups path puts critest's pods,
    which name no cgroup parent), and whether each is there now."""
    return {r / name: (r / name).exists() for r in cri._cgroup_roots()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cri-tools", type=Path, help="a git directory of cri-tools holding v1.26.1, or its tree")
    ap.add_argument("--containerd", default="1.7", choices=cri.CONTAINERDS)
    ap.add_argument("--handlers", default=",".join(cri.HANDLERS), help="comma-separated (default runc,sandbox)")
    ap.add_argument("--focus", action="append", default=[], help="ginkgo focus regexp (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="ginkgo skip regexp (repeatable), added to SKIP")
    ap.add_argument("--all", action="store_true", help="run the specs SKIP leaves out too")
    ap.add_argument("--out", type=Path, help="where the logs, reports and the table go (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for each handler's run")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("critest: needs root")
    if not args.in_namespace:
        # everything made before the namespace: downloads and the build leave nothing mounted
        critest_binary(args.cri_tools)
        images()
        fixtures.driver_535()
        rest = [a for a in argv if a != "--in-namespace"]
        # a mount namespace of our own, its root rshared (peer groups of its own, as on a
        # systemd host's): what containerd, the runtimes and the specs mount ends with it
        return subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c",
                               'mount --make-rshared / && exec "$@"', "sh", sys.executable, __file__,
                               "--in-namespace", *rest]).returncode
    binary = critest_binary(args.cri_tools)
    out = args.out or Path(tempfile.mkdtemp(prefix="critest-"))
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="critest-cri-", dir="/tmp"))
    handlers = args.handlers.split(",")
    skip = args.skip + ([] if args.all else SKIP)
    k8s_cgroups = _cgroup_dirs(cri.NAMESPACE)
    c = cri.CRI(base, fixtures.driver_535(), containerd=args.containerd, pod_network=True)
    results: dict[str, dict[str, dict]] = {}
    teardown: dict[str, list[str]] = {}
    problems: list[str] = []
    try:
        c.start()
        say(f"containerd {c.version} under {base}")
        for tar in images():
            r = c.ctr("images", "import", str(tar))
            if r.returncode != 0:
                raise SystemExit(f"critest: ctr images import {tar}: {r.stderr}")
        for handler in handlers:
            results[handler], teardown[handler] = run_critest(binary, c, handler, out / handler, args.focus, skip,
                                                              args.timeout)
    finally:
        problems = c.stop()
        for d, existed in k8s_cgroups.items():
            if not existed and d.is_dir():
                cgroups.remove_dirs([str(p) for p in d.rglob("*") if p.is_dir()] + [str(d)], patience=5)
        (out / "sandbox-errors.log").write_text(c.runtime_errors())
        shutil.copy(base / "containerd.log", out / "containerd.log")
        shutil.rmtree(base, ignore_errors=True)
    text = table(results)
    if len(handlers) == 2:
        a, b = handlers
        for first, second in ((a, b), (b, a)):
            diff = differences(results, first, second)
            text += f"\n\n{first} passes, {second} does not ({len(diff)}):\n" + ("\n".join(diff) or "(none)")
    for handler, errors in teardown.items():
        text += f"\n\n{handler}: containerd's teardown calls that failed ({len(errors)}; no spec counts them):\n"
        text += "\n".join(f"- {e}" for e in errors) or "(none)"
    if problems:
        text += "\n\nleft behind, removed: " + "; ".join(problems)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    say(f"logs, reports, the runtime's failing calls: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
