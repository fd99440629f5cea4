"""The command line, one table for every verb (TOP, VERB_FLAGS, POSITIONALS): runc's verbs
and flags plus ours. argparse reads it from the table (parser), and so, without argparse,
do the readers of the lines an engine runs per container (lean_args, hook_args,
cdi_hook_args: argparse and what it imports are ~11 ms of a start); verb_of finds the verb
before anything is parsed. Every namespace has every global (TOP). tests/sandbox/test_cli.py
holds each fast reader to what argparse makes of the same line."""

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

# The flags, one table: (names, dest, kind, default, help, lean, metavar). kind: "bool",
# "str", "int", "count" (an int, 0 or more), "strs" (given again: one more), "ints",
# "size" (a tmpfs size), or a tuple of the values allowed. parser() builds argparse from
# it; lean_args (lean: True) reads the verbs an engine runs per container from the same
# rows, and takes every row's default.
ROOTS = (
    (("--root",), "root", "str", None, f"state directory (default {DEFAULT_ROOT})", True, None),
    (("--driver-root",), "driver_root", "str", None, "where the driver is installed (default /, or the config file's)",
     True, None),
    (("--dev-root",), "dev_root", "str", None, "where the kernel module's dev/ and proc/ are (default: the driver "
     "root)", True, None),
)
TOP: tuple[tuple[Any, ...], ...] = ROOTS + (
    (("--log",), "log", "str", None, "append errors (and --debug lines) to this file", True, None),
    (("--log-format",), "log_format", ("text", "json"), "text", None, True, None),
    (("--debug",), "debug", "bool", False, "print a traceback with errors", True, None),
    (("--systemd-cgroup",), "systemd_cgroup", "bool", False,
     "the systemd cgroup manager: linux.cgroupsPath is slice:prefix:name, a transient scope unit", True, None),
    (("--config",), "config", "str", None, "config file (default $SANDBOX_CONFIG, else /etc/gpu-sandbox/config.toml)",
     True, None),
    (("--cdi-spec-dir",), "cdi_spec_dir", "strs", [], "CDI specs here too (after /etc/cdi and /var/run/cdi)", False,
     "DIR"),
    (("--criu",), "criu", "str", None, "accepted for runc's sake; checkpointing is not supported", False, None),
    (("--rootless",), "rootless", "str", None, "accepted for runc's sake; sandbox runs as root", False, None),
)
GPU = (
    (("--gpus",), "gpus", "str", None, "override NVIDIA_VISIBLE_DEVICES (all, none, indices, UUIDs, bus ids, MIG "
     "devices)", True, None),
    (("--capabilities",), "capabilities", "str", None, "override NVIDIA_DRIVER_CAPABILITIES", True, None),
)
CREATE = (
    (("-b", "--bundle"), "bundle", "str", None, "the bundle directory (default: the current directory)", True, None),
    (("--pid-file",), "pid_file", "str", None, "write the container's init pid here", True, None),
    (("--console-socket",), "console_socket", "str", None, "unix socket that receives the pty master "
     "(process.terminal)", True, None),
    (("--preserve-fds",), "preserve_fds", "count", 0, "pass fds 3..3+N-1 on to the container", True, "N"),
    (("--no-pivot",), "no_pivot", "bool", False, "accepted for runc's sake; we always pivot_root", True, None),
    (("--no-new-keyring",), "no_new_keyring", "bool", False, "accepted; no session keyring is made", True, None),
    (("--trace",), "trace", "str", None, "write a Chrome trace-event JSON of the startup", True, "FILE"),
    (("--scratch-size",), "scratch_size", "size", None,
     "cap of the tmpfs holding a GPU container's writes to its root (default 256m)", False, "SIZE"),
) + GPU
# the hook's (and `hook install`'s), and our CDI spec's hook's: read without argparse too
HOOK: tuple[tuple[Any, ...], ...] = (
    (("--capabilities",), "capabilities", "str", None, "capabilities allowed at most (default: any)", True, None),
    (("--trace",), "trace", "str", None, "write a Chrome trace-event JSON of the hook", True, "FILE"),
    (("--stage",), "stage", ("prestart", "createRuntime"), "createRuntime", "(install) which hook list to add it to",
     False, None),
    (("--server",), "server", "str", None, "the warm server's socket (default $SANDBOX_SERVER, else "
     "/run/gpu-sandbox/hook.sock; tried first, the hook works without it)", True, "SOCKET"),
)
CDI_HOOK: tuple[tuple[Any, ...], ...] = (
    (("--link",), "link", "strs", [], "(hook) a link to make", True, "NAME::PATH"),
    (("--cache-entry",), "cache_entry", "strs", [], "(hook) an entry of the container's ld.so.cache", True,
     "KEY::PATH::FLAGS"),
    (("--file",), "file", "strs", [], "(hook) a loader's file of this content, bound read-only at PATH", True,
     "PATH::CONTENT"),
)
FORMAT = (("-f", "--format"), "format", ("table", "json"), "table", None, True, None)
# Every verb's flags (after the verb; a global's there, ROOTS', keeps the value given before
# the verb unless given again) and its positional arguments: (dest, metavar, nargs, choices,
# help), nargs None (one), "?" or "..." (the rest, as it is).
VERB_FLAGS: dict[str, tuple[tuple[Any, ...], ...]] = {
    "create": ROOTS + CREATE,
    "run": ROOTS + CREATE + (
        (("-d", "--detach"), "detach", "bool", False, "create and start, then return", True, None),
        (("--keep",), "keep", "bool", False, "accepted; a foreground run deletes the container at exit", True, None),
        (("--id",), "id", "str", None, "(sandbox run BUNDLE) container id (default: the bundle directory's name)",
         True, None)),
    "start": ROOTS, "state": ROOTS,
    "kill": ROOTS + ((("-a", "--all"), "all", "bool", False, "signal every process of the container", True, None),),
    "delete": ROOTS + ((("-f", "--force"), "force", "bool", False, "kill it first if it is running", True, None),),
    "list": ROOTS + ((("-q", "--quiet"), "quiet", "bool", False, "ids only", True, None), FORMAT),
    "ps": ROOTS + (FORMAT,),
    "exec": ROOTS + (
        (("-p", "--process"), "process", "str", None, "a JSON file with the process to run (runtime-spec Process)",
         True, None),
        (("-d", "--detach"), "detach", "bool", False, "return once the process started", True, None),
        (("--pid-file",), "pid_file", "str", None, "write the new process's pid here", True, None),
        (("--console-socket",), "console_socket", "str", None, "unix socket that receives the pty master", True, None),
        (("-t", "--tty"), "tty", "bool", False, "allocate a pty", True, None),
        (("--cwd",), "cwd", "str", None, "working directory in the container", True, None),
        (("-e", "--env"), "env", "strs", [], "K=V added to the environment", True, None),
        (("-u", "--user"), "user", "str", None, "UID[:GID]", True, None),
        (("--additional-gids", "-g"), "additional_gids", "ints", [], None, True, None),
        (("-c", "--cap"), "cap", "strs", [], "add a capability", True, None),
        (("--no-new-privs",), "no_new_privs", "bool", False, None, True, None),
        (("--preserve-fds",), "preserve_fds", "count", 0, None, True, None),
        (("--apparmor",), "apparmor", "str", None, "the AppArmor profile to exec under (refused where AppArmor is "
         "off)", True, None),
        (("--process-label",), "process_label", "str", None, "the SELinux label to exec under (refused where SELinux "
         "is off)", True, None)),
    "update": ROOTS + (
        (("-r", "--resources"), "resources", "str", None, "linux.resources as JSON ('-': stdin)", False, "FILE"),
        *(((flag,), flag[2:].replace("-", "_"), "str", None, what, False, "VALUE") for flag, what in UPDATE_FLAGS.items())),
    "configure": (
        (("--config",), "config_file", "str", None, "the engine's config file (default: its own)", False, "FILE"),
        (("--default",), "default", "bool", False, "make sandbox the engine's default runtime", False, None),
        (("--name",), "name", "str", None, "the runtime's (handler's) name (default sandbox; with --remove, any)",
         False, None),
        (("--path",), "path", "str", None, "the sandbox executable (default: this installation's)", False, None),
        (("--remove",), "remove", "bool", False, "take out the runtimes that name this executable (and the default "
         "naming one of them)", False, None)),
    "features": (),
    "plan": ROOTS + GPU + (
        (("--json",), "json", "bool", False, "one JSON object instead of a table", False, None),),
    "cdi": ROOTS + (
        (("--cdi-spec-dir",), "cdi_spec_dir", "strs", [], "(list) CDI specs here too", False, "DIR"),
        (("--output", "-o"), "output", "str", None, "(generate) write the spec there, not to stdout", False, "FILE"),
        (("--format",), "format", ("yaml", "json"), "yaml", "(generate) default yaml", False, None)) + CDI_HOOK,
    "trace": ((("--svg",), "svg", "str", None, "also draw the timeline as an SVG picture", False, "FILE"),),
    "serve": (
        (("--server",), "server", "str", None, "where to listen (default $SANDBOX_SERVER, else "
         "/run/gpu-sandbox/hook.sock)", False, "SOCKET"),
        (("--idle-exit",), "idle_exit", "count", 0, "leave once idle this long, the socket removed first (0: never; "
         "the launcher starts a server so where none listens, from $SANDBOX_SERVER_IDLE)", False, "SECONDS"),
        (("--once",), "once", "bool", False, "serve the one request on fd 3, a connection the launcher made (its own "
         "planner where no server listens), and exit", False, None)),
    "hook": ROOTS + HOOK,
}
ID = ("container_id", "ID", None, None, "the container's id")
POSITIONALS: dict[str, tuple[tuple[Any, ...], ...]] = {
    "run": (("target", "ID|BUNDLE", None, None,
             "a container id (runc's run, bundle from -b or the cwd), or a bundle directory"),),
    "kill": (ID, ("signal", None, "?", None, None)),
    "exec": (ID, ("args", None, "...", None, "the command (unless --process)")),
    "list": (), "features": (), "serve": (),
    "configure": (("engine", None, None, ("docker", "podman", "containerd"), None),),
    "plan": (("bundle", None, None, None, None),),
    "cdi": (("action", None, None, ("generate", "list", "hook"), None),),
    "trace": (("file", None, None, None, None),),
    "hook": (("action", None, "?", ("install", "serve"), "install: add the hook to a bundle; serve: run a warm server"),
             ("bundle", None, "?", None, "(install) the bundle whose config.json gets the hook")),
}
POSITIONAL_DEFAULTS: dict[str, dict[str, Any]] = {"kill": {"signal": "TERM"}, "exec": {"args": []}}
LEAN_VERBS = ("create", "run", "start", "state", "kill", "delete", "list", "ps", "exec")  # an engine's, per container
# Global options that take a value (scanned before argparse, to find the verb early; the
# launcher, sandbox/executor/launcher.c, is built with this list).
GLOBAL_VALUES = tuple(name for names, _, kind, *_ in TOP if kind != "bool" for name in names)
TOP_DESTS = frozenset(dest for _n, dest, *_ in TOP)


def _add(p, rows, after_verb: bool = False) -> None:
    """argparse arguments for ``rows`` of the table (``after_verb``: a global's keeps the value
    given before the verb: no default of its own there)."""
    import argparse

    for names, dest, kind, default, help_, _lean, metavar in rows:
        kw: dict[str, Any] = {"dest": dest, "help": help_, "default": argparse.SUPPRESS if after_verb and dest in
                              TOP_DESTS else ([] if kind in ("strs", "ints") else default)}
        if kind == "bool":
            kw["action"] = "store_true"
        elif kind in ("strs", "ints"):
            kw["action"] = "append"
        if kind in ("int", "ints"):
            kw["type"] = int
        elif kind == "count":
            kw["type"] = _count
        elif kind == "size":
            kw["type"] = _size
        elif isinstance(kind, tuple):
            kw["choices"] = list(kind)
        if metavar:
            kw["metavar"] = metavar
        p.add_argument(*names, **kw)


def _count(value: str) -> int:
    """0 or more, in ASCII digits: argparse's int alone takes "-4" (and " 4", other scripts' digits)."""
    import argparse

    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError("must be 0 or more")
    return int(value)


def _size(value: str) -> str:
    """A tmpfs size= value: bytes with an optional k/m/g suffix, or a percentage of RAM."""
    import argparse
    import re

    if not re.fullmatch(r"[0-9]{1,15}[kKmMgG%]?", value) or int(value.rstrip("kKmMgG%")) == 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size (such as 256m, 2g or 10%)")
    return value


def parser():
    import argparse  # here, not at the top: the hook's fast path never needs it

    class Parser(argparse.ArgumentParser):
        def __init__(self, *args, **kw):  # no abbreviated flags (runc takes none; verb_of could not skip one's value)
            super().__init__(*args, **{"allow_abbrev": False, **kw})

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
    _add(ap, TOP)
    class Version(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(version_text())
            raise SystemExit(0)

    ap.add_argument("--version", "-v", action=Version, nargs=0, default=argparse.SUPPRESS,
                    help="version, commit, spec, libseccomp")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, rows in VERB_FLAGS.items():
        p = sub.add_parser(verb, help=VERBS[verb])
        _add(p, rows, after_verb=True)
        for dest, metavar, nargs, choices, help_ in POSITIONALS.get(verb, (ID,)):
            kw: dict[str, Any] = {"help": help_}
            if nargs:
                kw["nargs"] = argparse.REMAINDER if nargs == "..." else nargs
            if choices:
                kw["choices"] = list(choices)
            if metavar:
                kw["metavar"] = metavar
            if dest in POSITIONAL_DEFAULTS.get(verb, {}):
                kw["default"] = POSITIONAL_DEFAULTS[verb][dest]
            p.add_argument(dest, **kw)
    return ap


def _options(argv: list[str], rows) -> dict[str, Any] | None:
    """``--flag value`` pairs of the table's ``rows`` (their lean ones), as argparse would
    read them, over every row's default; None for anything else."""
    table = _lean(rows)
    ns = _defaults(rows)
    if len(argv) % 2:
        return None
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        if flag not in table or value.startswith("-"):
            return None
        key, kind = table[flag]
        ns[key] = [*ns[key], value] if kind == "strs" else value
    return ns


def hook_args(argv: list[str]):
    """The hook's command line as `hook install` writes it (ROOTS and HOOK), read without
    argparse: argparse (and the shutil, gettext, lzma it pulls in) is ~11 ms of every
    container start under a runtime. Anything else returns None and goes through the full
    parser."""
    import types

    ns = _options(argv[1:], (*ROOTS[1:], *HOOK)) if argv[:1] == ["hook"] else None
    if ns is None:
        return None
    return types.SimpleNamespace(**{**_defaults(TOP), **ns}, verb="hook", action=None, bundle=None)


def cdi_hook_args(argv: list[str]):
    """`cdi hook` as our CDI spec writes it (CDI_HOOK), read without argparse (a served hook's
    child, or our Python's); anything else is None."""
    import types

    ns = _options(argv[2:], CDI_HOOK) if argv[:2] == ["cdi", "hook"] else None
    return None if ns is None else types.SimpleNamespace(**{**_defaults(TOP), **ns}, verb="cdi", action="hook")


def _lean(rows) -> dict[str, tuple[str, Any]]:
    return {name: (dest, kind) for names, dest, kind, _d, _h, lean, _m in rows if lean for name in names}


LEAN_GLOBALS = _lean(TOP)
LEAN_FLAGS = {verb: _lean(VERB_FLAGS[verb]) for verb in LEAN_VERBS}


def _defaults(rows) -> dict[str, Any]:
    return {dest: ([] if kind in ("strs", "ints") else default) for _n, dest, kind, default, *_ in rows}


def lean_args(argv: list[str]):
    """The command line of the verbs an engine runs per container (VERB_FLAGS), read
    without argparse (~6 ms of every such call, on a container's critical path for create
    and run). Anything unusual (help, an unknown or abbreviated flag, a missing or extra
    argument) returns None and goes through the full parser, which explains itself; the
    result is the namespace that parser gives (tests/sandbox/test_cli.py compares them)."""
    import types

    ns: dict[str, Any] = _defaults(TOP)
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
        table = LEAN_GLOBALS if verb is None else LEAN_FLAGS[verb]
        if arg in table:
            key, kind = table[arg]
            if kind == "bool":
                if value is not None:
                    return None
                ns[key] = True
            else:
                if value is None:
                    if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                        return None  # (argparse takes no value that looks like a flag)
                    i, value = i + 1, argv[i + 1]
                got: Any = value
                if kind in ("int", "ints", "count"):
                    if not value.isascii() or not value.isdigit():
                        return None  # (argparse says why)
                    got = int(value)
                elif isinstance(kind, tuple) and value not in kind:
                    return None
                ns[key] = [*ns[key], got] if kind in ("strs", "ints") else got
        elif arg.startswith("-") and arg != "-":
            return None
        elif verb is None:
            if arg not in LEAN_FLAGS:
                return None
            verb = arg
            ns = {**_defaults(VERB_FLAGS[verb]), **POSITIONAL_DEFAULTS.get(verb, {}), **ns}
        else:
            positional.append(arg)
        i += 1
    if verb is None:
        return None
    rows = [row for row in POSITIONALS.get(verb, (ID,)) if row[2] != "..."]  # (exec's command: taken above)
    if not sum(row[2] is None for row in rows) <= len(positional) <= len(rows):
        return None
    for (dest, _metavar, _nargs, choices, _help), value in zip(rows, positional, strict=False):
        if choices is not None and value not in choices:
            return None
        ns[dest] = value
    return types.SimpleNamespace(verb=verb, **ns)


def verb_of(argv: list[str]) -> str | None:
    """The verb, found past the global options without parsing (run and create fork their
    gofer before anything else is imported)."""
    i = verb_index(argv)
    return argv[i] if i is not None else None


def verb_index(argv: list[str]) -> int | None:
    """Where verb_of's verb is in ``argv``."""
    i = 0
    while i < len(argv):
        if not argv[i].startswith("-"):
            return i
        i += 2 if argv[i] in GLOBAL_VALUES else 1
    return None


def hook_call(argv: list[str]) -> bool:
    """Whether ``argv`` (from the verb on) is an OCI hook's call, the container's state on
    stdin: `hook` as `hook install` writes it, or our CDI spec's `cdi hook` (the rule of
    launcher.c's hook_call, which has the server serve it)."""
    if argv[:2] == ["cdi", "hook"]:
        return True
    return argv[:1] == ["hook"] and "install" not in argv and "serve" not in argv


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
