"""The command line: runc's verbs and flags plus ours, as argparse reads them (parser) and
as the verbs an engine runs per container are read without argparse (lean_args,
hook_args, cdi_hook_args: argparse and what it imports are ~11 ms of a start); verb_of
finds the verb before anything is parsed. tests/sandbox/test_cli.py holds each fast reader
to what argparse makes of the same line."""

from __future__ import annotations

import os

from sandbox.messages import log_error, log_flags, stderr_line

TYPE_CHECKING = False  # typing's flag without importing typing (start-up time); mypy reads it as True
if TYPE_CHECKING:
    from typing import Any

VERSION = "0.1.0"
DEFAULT_ROOT = "/run/sandbox"

VERBS = {
    "create": "create a container from a bundle; its process waits for start",
    "start": "start the process of a created container",
    "run": "create and start a container (runc's run), or run an OCI bundle (sandbox run BUNDLE)",
    "exec": "run a new process inside a running container",
    "state": "print a container's state as JSON",
    "kill": "send a signal to a container's init (default SIGTERM)",
    "delete": "delete a stopped container (--force: any)",
    "list": "list the containers",
    "ps": "list the processes of a container",
    "update": "change a running container's resource limits (runc's update)",
    "configure": "add sandbox to docker's, podman's or containerd's config (as nvidia-ctk runtime configure)",
    "features": "print the runtime's features as JSON",
    "plan": "print the GPU mount plan for a bundle",
    "trace": "print (or draw) the phases of a startup trace",
    "hook": "OCI prestart/createRuntime hook for runc and crun (hook install: add it to a bundle)",
    "serve": "the warm server: serves hooks, and the verbs that start no process, from imported code",
    "cdi": "CDI: generate our spec, list the devices the specs define, or run our spec's hook",
}
# runc update's single-value flags (and the linux.resources field each one sets)
UPDATE_FLAGS = {
    "--blkio-weight": "blockIO.weight", "--cpu-period": "cpu.period", "--cpu-quota": "cpu.quota",
    "--cpu-rt-period": "cpu.realtimePeriod", "--cpu-rt-runtime": "cpu.realtimeRuntime", "--cpu-share": "cpu.shares",
    "--cpuset-cpus": "cpu.cpus", "--cpuset-mems": "cpu.mems", "--kernel-memory": "memory.kernel",
    "--kernel-memory-tcp": "memory.kernelTCP", "--memory": "memory.limit", "--memory-reservation":
    "memory.reservation", "--memory-swap": "memory.swap", "--pids-limit": "pids.limit",
    "--l3-cache-schema": "intelRdt", "--mem-bw-schema": "intelRdt"}
# Global options that take a value (scanned before argparse, to find the verb early).
GLOBAL_VALUES = ("--root", "--log", "--log-format", "--driver-root", "--dev-root", "--config", "--criu",
                 "--rootless", "--cdi-spec-dir")


def _size(value: str) -> str:
    """A tmpfs size= value: bytes with an optional k/m/g suffix, or a percentage of RAM."""
    import argparse
    import re

    if not re.fullmatch(r"[0-9]{1,15}[kKmMgG%]?", value) or int(value.rstrip("kKmMgG%")) == 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size (such as 256m, 2g or 10%)")
    return value


def _globals(p, suppress: bool) -> None:
    """Options accepted before the verb (runc's place) and, for the old interface, after it."""
    import argparse

    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    p.add_argument("--root", default=d(None), help=f"state directory (default {DEFAULT_ROOT})")
    p.add_argument("--driver-root", default=d(None), help="where the driver is installed (default /, or the config file's)")
    p.add_argument("--dev-root", default=d(None), help="where the kernel module's dev/ and proc/ are (default: the driver root)")


def _container(p, ids: str = "container_id") -> None:
    p.add_argument(ids, metavar="ID", help="the container's id")


def _gpu_options(p) -> None:
    p.add_argument("--gpus", help="override NVIDIA_VISIBLE_DEVICES (all, none, indices, UUIDs, bus ids, MIG devices)")
    p.add_argument("--capabilities", help="override NVIDIA_DRIVER_CAPABILITIES")


def _create_options(p) -> None:
    p.add_argument("-b", "--bundle", help="the bundle directory (default: the current directory)")
    p.add_argument("--pid-file", help="write the container's init pid here")
    p.add_argument("--console-socket", help="unix socket that receives the pty master (process.terminal)")
    p.add_argument("--preserve-fds", type=int, default=0, metavar="N", help="pass fds 3..3+N-1 on to the container")
    p.add_argument("--no-pivot", action="store_true", help="accepted for runc's sake; we always pivot_root")
    p.add_argument("--no-new-keyring", action="store_true", help="accepted; no session keyring is made")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON of the startup")
    p.add_argument("--scratch-size", type=_size, metavar="SIZE",
                   help="cap of the tmpfs holding a GPU container's writes to its root (default 256m)")
    _gpu_options(p)


def parser():
    import argparse  # here, not at the top: the hook's fast path never needs it

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, as every other error (argparse prints usage too)
            prog = self.prog
            verb = verb_of(_ARGV)
            if prog == "sandbox" and verb in VERBS:  # (argparse's top level says what its verb's do not know)
                prog = f"sandbox {verb}"
            line = f"{prog}: {message} (see {prog} --help)"
            log_error(log_flags(_ARGV), line)  # where an engine's shim looks, first
            stderr_line(line)
            raise SystemExit(2)

    ap = Parser(prog="sandbox", description="Run OCI containers with the host's NVIDIA GPUs, as runc runs them "
                "(the same verbs and flags, for podman, Docker and containerd), plus verbs of our own.")
    _globals(ap, suppress=False)
    ap.add_argument("--log", help="append errors (and --debug lines) to this file")
    ap.add_argument("--log-format", choices=["text", "json"], default="text")
    ap.add_argument("--debug", action="store_true", help="print a traceback with errors")
    ap.add_argument("--systemd-cgroup", action="store_true",
                    help="the systemd cgroup manager: linux.cgroupsPath is slice:prefix:name, a transient scope unit")
    ap.add_argument("--config", help="config file (default $SANDBOX_CONFIG, else /etc/gpu-sandbox/config.toml)")
    ap.add_argument("--cdi-spec-dir", action="append", default=[], metavar="DIR",
                    help="CDI specs here too (after /etc/cdi and /var/run/cdi)")
    ap.add_argument("--criu", help="accepted for runc's sake; checkpointing is not supported")
    ap.add_argument("--rootless", help="accepted for runc's sake; sandbox runs as root")
    class Version(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(version_text())
            raise SystemExit(0)

    ap.add_argument("--version", "-v", action=Version, nargs=0, default=argparse.SUPPRESS,
                    help="version, commit, spec, libseccomp")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("create", help=VERBS["create"])
    _globals(p, suppress=True)
    _create_options(p)
    _container(p)

    p = sub.add_parser("run", help=VERBS["run"])
    _globals(p, suppress=True)
    _create_options(p)
    p.add_argument("-d", "--detach", action="store_true", help="create and start, then return")
    p.add_argument("--keep", action="store_true", help="accepted; a foreground run deletes the container at exit")
    p.add_argument("--id", help="(sandbox run BUNDLE) container id (default: the bundle directory's name)")
    p.add_argument("target", metavar="ID|BUNDLE",
                   help="a container id (runc's run, bundle from -b or the cwd), or a bundle directory")

    p = sub.add_parser("start", help=VERBS["start"])
    _globals(p, suppress=True)
    _container(p)

    p = sub.add_parser("state", help=VERBS["state"])
    _globals(p, suppress=True)
    _container(p)

    p = sub.add_parser("kill", help=VERBS["kill"])
    _globals(p, suppress=True)
    p.add_argument("-a", "--all", action="store_true", help="signal every process of the container")
    _container(p)
    p.add_argument("signal", nargs="?", default="TERM")

    p = sub.add_parser("delete", help=VERBS["delete"])
    _globals(p, suppress=True)
    p.add_argument("-f", "--force", action="store_true", help="kill it first if it is running")
    _container(p)

    p = sub.add_parser("list", help=VERBS["list"])
    _globals(p, suppress=True)
    p.add_argument("-q", "--quiet", action="store_true", help="ids only")
    p.add_argument("-f", "--format", choices=["table", "json"], default="table")

    p = sub.add_parser("ps", help=VERBS["ps"])
    _globals(p, suppress=True)
    p.add_argument("-f", "--format", choices=["table", "json"], default="table")
    _container(p)

    p = sub.add_parser("configure", help=VERBS["configure"])
    p.add_argument("engine", choices=["docker", "podman", "containerd"])
    p.add_argument("--config", dest="config_file", metavar="FILE", help="the engine's config file (default: its own)")
    p.add_argument("--default", action="store_true", help="make sandbox the engine's default runtime")
    p.add_argument("--name", default="sandbox", help="the runtime's (handler's) name (default sandbox)")
    p.add_argument("--path", help="the sandbox executable (default: this installation's)")

    p = sub.add_parser("update", help=VERBS["update"])
    _globals(p, suppress=True)
    p.add_argument("-r", "--resources", metavar="FILE", help="linux.resources as JSON ('-': stdin)")
    for flag, what in UPDATE_FLAGS.items():
        p.add_argument(flag, metavar="VALUE", help=what)
    _container(p)

    p = sub.add_parser("exec", help=VERBS["exec"])
    _globals(p, suppress=True)
    p.add_argument("-p", "--process", help="a JSON file with the process to run (runtime-spec Process)")
    p.add_argument("-d", "--detach", action="store_true", help="return once the process started")
    p.add_argument("--pid-file", help="write the new process's pid here")
    p.add_argument("--console-socket", help="unix socket that receives the pty master")
    p.add_argument("-t", "--tty", action="store_true", help="allocate a pty")
    p.add_argument("--cwd", help="working directory in the container")
    p.add_argument("-e", "--env", action="append", default=[], help="K=V added to the environment")
    p.add_argument("-u", "--user", help="UID[:GID]")
    p.add_argument("--additional-gids", "-g", action="append", type=int, default=[])
    p.add_argument("-c", "--cap", action="append", default=[], help="add a capability")
    p.add_argument("--no-new-privs", action="store_true")
    p.add_argument("--preserve-fds", type=int, default=0)
    p.add_argument("--apparmor", help="the AppArmor profile to exec under (refused where AppArmor is off)")
    p.add_argument("--process-label", help="the SELinux label to exec under (refused where SELinux is off)")
    _container(p)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the command (unless --process)")

    p = sub.add_parser("features", help=VERBS["features"])

    p = sub.add_parser("plan", help=VERBS["plan"])
    _globals(p, suppress=True)
    p.add_argument("bundle")
    _gpu_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")

    p = sub.add_parser("cdi", help=VERBS["cdi"])
    p.add_argument("action", choices=["generate", "list", "hook"])
    _globals(p, suppress=True)
    p.add_argument("--cdi-spec-dir", action="append", default=argparse.SUPPRESS, metavar="DIR",
                   help="(list) CDI specs here too")
    p.add_argument("--output", "-o", metavar="FILE", help="(generate) write the spec there, not to stdout")
    p.add_argument("--format", choices=["yaml", "json"], default="yaml", help="(generate) default yaml")
    p.add_argument("--link", action="append", default=[], metavar="NAME::PATH", help="(hook) a link to make")
    p.add_argument("--cache-entry", action="append", default=[], metavar="KEY::PATH::FLAGS",
                   help="(hook) an entry of the container's ld.so.cache")
    p.add_argument("--file", action="append", default=[], metavar="PATH::CONTENT",
                   help="(hook) a loader's file of this content, bound read-only at PATH")

    p = sub.add_parser("trace", help=VERBS["trace"])
    p.add_argument("file")
    p.add_argument("--svg", metavar="FILE", help="also draw the timeline as an SVG picture")

    p = sub.add_parser("serve", help=VERBS["serve"])
    p.add_argument("--server", metavar="SOCKET", help="where to listen (default $SANDBOX_SERVER, "
                   "else /run/gpu-sandbox/hook.sock)")

    p = sub.add_parser("hook", help=VERBS["hook"])
    p.add_argument("action", nargs="?", choices=["install", "serve"],
                   help="install: add the hook to a bundle; serve: run a warm hook server")
    p.add_argument("bundle", nargs="?", help="(install) the bundle whose config.json gets the hook")
    _globals(p, suppress=True)
    p.add_argument("--capabilities", help="capabilities allowed at most (default: any)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON of the hook")
    p.add_argument("--stage", choices=["prestart", "createRuntime"], default="createRuntime",
                   help="(install) which hook list to add it to")
    p.add_argument("--server", metavar="SOCKET", help="the warm hook server's socket "
                   "(default /run/gpu-sandbox/hook.sock; tried first, the hook works without it)")
    return ap


HOOK_OPTIONS = ("--driver-root", "--dev-root", "--capabilities", "--trace", "--server")


def hook_args(argv: list[str]):
    """The hook's command line as `hook install` writes it, read without argparse: argparse
    (and the shutil, gettext, lzma it pulls in) is ~11 ms of every container start under a
    runtime. Anything else returns None and goes through the full parser."""
    import types

    if not argv or argv[0] != "hook" or len(argv) % 2 == 0:
        return None
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    if not set(opts) <= set(HOOK_OPTIONS):
        return None
    return types.SimpleNamespace(verb="hook", action=None, bundle=None, stage=None, config=None, log=None,
                                 debug=False, root=None,
                                 **{o[2:].replace("-", "_"): opts.get(o) for o in HOOK_OPTIONS})


CDI_HOOK_OPTIONS = {"--link": "link", "--file": "file", "--cache-entry": "cache_entry"}


def cdi_hook_args(argv: list[str]):
    """`cdi hook` as our CDI spec writes it (its three repeated options), read without
    argparse, for the warm server; anything else is None."""
    import types

    if argv[:2] != ["cdi", "hook"] or len(argv) % 2:
        return None
    ns: dict[str, list[str]] = {key: [] for key in CDI_HOOK_OPTIONS.values()}
    for flag, value in zip(argv[2::2], argv[3::2], strict=True):
        if flag not in CDI_HOOK_OPTIONS:
            return None
        ns[CDI_HOOK_OPTIONS[flag]].append(value)
    return types.SimpleNamespace(verb="cdi", action="hook", **ns)


# The verbs an engine runs once per container, with their flags: parsed without argparse
# (--scratch-size, --cdi-spec-dir and anything else rare take the full parser).
_CREATE = {"-b": "bundle", "--bundle": "bundle", "--pid-file": "pid_file", "--console-socket": "console_socket",
           "--preserve-fds": "preserve_fds", "--no-pivot": "no_pivot", "--no-new-keyring": "no_new_keyring",
           "--trace": "trace", "--gpus": "gpus", "--capabilities": "capabilities"}
LEAN_FLAGS = {"start": {}, "state": {}, "kill": {"-a": "all", "--all": "all"},
              "delete": {"-f": "force", "--force": "force"},
              "list": {"-q": "quiet", "--quiet": "quiet", "-f": "format", "--format": "format"},
              "ps": {"-f": "format", "--format": "format"},
              "create": _CREATE,
              "run": {**_CREATE, "-d": "detach", "--detach": "detach", "--keep": "keep", "--id": "id"},
              "exec": {"-p": "process", "--process": "process", "-d": "detach", "--detach": "detach",
                       "--pid-file": "pid_file", "--console-socket": "console_socket", "-t": "tty", "--tty": "tty",
                       "--cwd": "cwd", "-e": "env", "--env": "env", "-u": "user", "--user": "user",
                       "-g": "additional_gids", "--additional-gids": "additional_gids", "-c": "cap", "--cap": "cap",
                       "--no-new-privs": "no_new_privs", "--preserve-fds": "preserve_fds", "--apparmor": "apparmor",
                       "--process-label": "process_label"}}
_CREATE_DEFAULTS = {"bundle": None, "pid_file": None, "console_socket": None, "preserve_fds": 0, "no_pivot": False,
                    "no_new_keyring": False, "trace": None, "scratch_size": None, "gpus": None, "capabilities": None}
LEAN_DEFAULTS: dict[str, dict[str, Any]] = {
    "start": {}, "state": {}, "kill": {"all": False, "signal": "TERM"}, "delete": {"force": False},
    "list": {"quiet": False, "format": "table"}, "ps": {"format": "table"},
    "create": _CREATE_DEFAULTS,
    "run": {**_CREATE_DEFAULTS, "detach": False, "keep": False, "id": None},
    "exec": {"process": None, "detach": False, "pid_file": None, "console_socket": None, "tty": False, "cwd": None,
             "env": [], "user": None, "additional_gids": [], "cap": [], "no_new_privs": False, "preserve_fds": 0,
             "apparmor": None, "process_label": None, "args": []}}
LEAN_GLOBALS = {"--root": "root", "--log": "log", "--log-format": "log_format", "--driver-root": "driver_root",
                "--dev-root": "dev_root", "--config": "config", "--debug": "debug",
                "--systemd-cgroup": "systemd_cgroup"}
# after the verb argparse takes only these of the globals (cli._globals)
LEAN_AFTER_VERB = {k: v for k, v in LEAN_GLOBALS.items() if k in ("--root", "--driver-root", "--dev-root")}
_TAKES_VALUE = {"root", "log", "log_format", "driver_root", "dev_root", "config", "format", "bundle", "pid_file",
                "console_socket", "preserve_fds", "trace", "gpus", "capabilities", "id", "process", "cwd", "env",
                "user", "additional_gids", "cap", "apparmor", "process_label"}
_APPENDS = {"env", "additional_gids", "cap"}  # flags given again add to a list


def lean_args(argv: list[str]):
    """The command line of the verbs an engine runs per container (LEAN_FLAGS), read
    without argparse (~6 ms of every such call, on a container's critical path for create
    and run). Anything unusual (help, an unknown or abbreviated flag, a missing or extra
    argument) returns None and goes through the full parser, which explains itself; the
    result is the namespace that parser gives (tests/sandbox/test_cli.py compares them)."""
    import types

    ns: dict[str, Any] = {"root": None, "log": None, "log_format": "text", "debug": False, "config": None,
                          "driver_root": None, "dev_root": None, "systemd_cgroup": False, "cdi_spec_dir": [],
                          "criu": None, "rootless": None}
    positional: list[str] = []
    verb = None
    i = 0
    while i < len(argv):
        arg, value = argv[i], None
        if verb == "exec" and positional:  # exec ID ARGS...: the rest is the command, as it is
            ns["args"] = argv[i:]
            break
        if arg.startswith("--") and "=" in arg:
            arg, value = arg.split("=", 1)
        table = LEAN_GLOBALS if verb is None else {**LEAN_AFTER_VERB, **LEAN_FLAGS[verb]}
        if arg in table:
            key = table[arg]
            if key in _TAKES_VALUE:
                if value is None:
                    if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                        return None  # (argparse takes no value that looks like a flag)
                    i, value = i + 1, argv[i + 1]
                if key in _APPENDS:
                    ns[key] = [*ns[key], value]
                else:
                    ns[key] = value
            elif value is not None:
                return None
            else:
                ns[key] = True
        elif arg.startswith("-") and arg != "-":
            return None
        elif verb is None:
            if arg not in LEAN_FLAGS:
                return None
            verb = arg
            ns = {**LEAN_DEFAULTS[verb], **ns}
        else:
            positional.append(arg)
        i += 1
    if verb is None:
        return None
    lo, hi = {"list": (0, 0), "kill": (1, 2)}.get(verb, (1, 1))
    if verb == "exec":
        if not all(g.isascii() and g.isdigit() for g in ns["additional_gids"]):
            return None
        ns["additional_gids"] = [int(g) for g in ns["additional_gids"]]
    if not lo <= len(positional) <= hi or ns.get("format", "table") not in ("table", "json") \
            or ns["log_format"] not in ("text", "json"):
        return None
    if "preserve_fds" in ns:
        if not str(ns["preserve_fds"]).isascii() or not str(ns["preserve_fds"]).isdigit():
            return None
        ns["preserve_fds"] = int(ns["preserve_fds"])
    if positional:
        ns["target" if verb == "run" else "container_id"] = positional[0]
    if len(positional) == 2:
        ns["signal"] = positional[1]
    return types.SimpleNamespace(verb=verb, **ns)


def verb_of(argv: list[str]) -> str | None:
    """The verb, found past the global options without parsing (run and create fork their
    gofer before anything else is imported)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            return a
        i += 2 if a in GLOBAL_VALUES else 1
    return None


_ARGV: list[str] = []  # the command line main() was given (for an argparse error's --log)


def version_text() -> str:
    """What runc's --version prints: version, commit, spec version, libseccomp's version."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:  # an installed copy's (scripts/install writes it), else the checkout's
        with open(os.path.join(here, "COMMIT")) as f:
            commit = f.read().strip()
    except OSError:
        try:
            commit = subprocess.run(["git", "-C", os.path.dirname(here), "rev-parse", "--short=12", "HEAD"],
                                    capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    from gofer.syscalls import seccomp_version

    seccomp = seccomp_version() or "not found"
    return f"sandbox version {VERSION}\ncommit: {commit}\nspec: 1.0.2\nlibseccomp: {seccomp}"
