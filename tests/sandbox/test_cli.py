"""The lean command-line reader gives exactly argparse's namespace, or defers to argparse."""

import pytest

from sandbox.flags import VERBS, lean_args, parser

SAME = [
    ["start", "c1"], ["--root", "/r", "state", "c1"], ["kill", "c1"], ["kill", "--all", "c1", "KILL"],
    ["delete", "-f", "c1"], ["list", "-q", "--format", "json"], ["ps", "c1"],
    ["--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p", "c1"],
    ["create", "-b", "/b", "--console-socket", "/s", "--preserve-fds", "2", "--no-pivot", "--no-new-keyring", "c1"],
    ["--systemd-cgroup", "--debug", "create", "--bundle=/b", "c1"],
    ["run", "/bundle"], ["run", "--root", "/r", "-d", "-b", "/b", "--pid-file", "/p", "c1"],
    ["--driver-root", "/d", "run", "--gpus", "0", "--capabilities", "compute", "--trace", "/t.json", "--id", "x", "/b"],
    ["run", "--keep", "--detach", "c1"],
    ["exec", "c1", "true"], ["exec", "c1"], ["exec", "c1", "sh", "-c", "echo -e --tty"],
    ["--root", "/r", "exec", "--process", "/p.json", "--detach", "--pid-file", "/pid", "c1"],
    ["exec", "-t", "--console-socket", "/s", "-e", "A=1", "-e", "B=2", "--cwd", "/w", "-u", "5:6", "-g", "7",
     "--additional-gids", "8", "-c", "CAP_KILL", "--cap", "CAP_CHOWN", "--no-new-privs", "--preserve-fds", "1",
     "--apparmor", "x", "--process-label", "y", "c1", "ls", "-l"],
]
DEFERRED = [
    ["run"], ["create", "a", "b"], ["run", "--scratch-size", "1g", "/b"], ["create", "--preserve-fds", "x", "c"],
    ["create", "--bund", "/b", "c1"], ["run", "--help"], ["--cdi-spec-dir", "/c", "run", "/b"], ["exec", "-g", "x", "c1"],
    ["exec", "-cCAP_KILL", "c1", "true"], ["exec", "--tty=1", "c1"],
    ["create", "--pid-file"], ["list", "--format", "yaml"],
    # argparse refuses these: globals it takes only before the verb, a value that looks like a flag
    ["create", "--config", "/f", "--debug", "c1"], ["run", "--log", "/l", "--log-format", "json", "/b"],
    ["create", "--pid-file", "--bundle", "c1"], ["delete", "--debug", "c1"],
]


@pytest.mark.parametrize("argv", SAME, ids=" ".join)
def test_lean_reads_what_argparse_reads(argv):
    assert vars(lean_args(argv)) == vars(parser().parse_args(argv))


@pytest.mark.parametrize("argv", DEFERRED, ids=" ".join)
def test_anything_else_goes_to_argparse(argv):
    assert lean_args(argv) is None


@pytest.mark.parametrize("argv", [
    ["run", "--preserve-fds", "-4", "c1"], ["run", "--preserve-fds=-4", "c1"], ["create", "--preserve-fds", "-1", "c"],
    ["exec", "--preserve-fds", "-4", "c1", "true"], ["create", "--preserve-fds", "x", "c"],
    ["create", "--preserve-fds", "\u0664", "c"],
], ids=" ".join)
def test_preserve_fds_is_0_or_more(argv, capsys):
    """argparse's int takes "-4" (it looks like a number, not a flag); a negative count would
    pass every fd of the caller's on (finding 2 of issue #29)."""
    assert lean_args(argv) is None
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --preserve-fds: must be 0 or more" in err, err


def test_a_fuzzed_command_line_is_read_alike_or_deferred():
    """Random command lines from the verbs' own flags: lean accepts only what argparse
    accepts, and then reads it the same."""
    import random

    words = ["create", "run", "start", "kill", "delete", "list", "ps", "state", "-b", "--bundle", "--pid-file",
             "--root", "--driver-root", "--log", "--debug", "--config", "-d", "--id", "--gpus", "-f", "--force",
             "--format", "json", "table", "c1", "/b", "-a", "KILL", "--preserve-fds", "3", "--no-pivot", "-q",
             "exec", "-t", "-e", "A=1", "-c", "--cap", "-u", "-g", "7", "--process", "sh"]
    rng = random.Random(12)
    p = parser()
    for _ in range(3000):
        argv = [rng.choice(words) for _ in range(rng.randint(1, 6))]
        lean = lean_args(argv)
        if lean is None:
            continue
        try:
            full = p.parse_args(argv)
        except SystemExit:
            raise AssertionError(f"lean accepts what argparse refuses: {argv}") from None
        assert vars(lean) == vars(full), argv


def test_first_hour_messages(tmp_path, monkeypatch):
    """Each one line with the fix in it."""
    import subprocess
    import sys

    def cli(*argv, stdin=subprocess.DEVNULL, cwd=None):
        return subprocess.run([sys.executable, "-m", "sandbox.cli", "--root", str(tmp_path / "s"), *argv],
                              capture_output=True, text=True, stdin=stdin, cwd=cwd, timeout=60)

    r = cli("run", str(tmp_path / "missing"))  # (Python's own entry has the launcher run it: its planner says)
    assert r.returncode == 2 and r.stderr == f"sandbox run: {tmp_path / 'missing'}: no such directory (the bundle: " \
        "a directory with a config.json)\n", r.stderr
    r = cli("run", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "nope: no such bundle directory" in r.stderr and "sandbox run BUNDLE" in r.stderr
    r = cli("run", str(tmp_path), "--bogus")
    assert r.returncode == 2 and r.stderr == "sandbox run: unrecognized arguments: --bogus (see sandbox run --help)\n"
    r = cli("hook")
    assert r.returncode == 2 and "empty" in r.stderr and "sandbox hook install BUNDLE" in r.stderr, r.stderr
    lines = cli("--version").stdout.splitlines()
    assert [line.split(":")[0].split(" ")[0] for line in lines] == ["sandbox", "commit", "spec", "libseccomp"]
    r = cli("plan", str(tmp_path), "--driver-root", str(tmp_path))
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1


def test_no_driver_says_where_to_point(tmp_path):
    import pytest

    from mounts.driver import discover
    from mounts.errors import DriverError

    with pytest.raises(DriverError, match="--driver-root .or driver-root in /etc/gpu-sandbox/config.toml."):
        discover(str(tmp_path), str(tmp_path))


@pytest.mark.parametrize("argv", [
    ["cdi", "hook"], ["cdi", "hook", "--link", "a::/b", "--link", "c::/d", "--file", "/x::y"],
    ["cdi", "hook", "--cache-entry", "k::/p::0x303"],
])
def test_our_cdi_hooks_line_is_read_as_argparse_reads_it(argv):
    from sandbox.flags import cdi_hook_args

    fast, full = cdi_hook_args(argv), parser().parse_args(argv)
    assert {k: getattr(fast, k) for k in ("verb", "action", "link", "file", "cache_entry")} == \
           {k: getattr(full, k) for k in ("verb", "action", "link", "file", "cache_entry")}


@pytest.mark.parametrize("argv", [["cdi", "hook", "--link"], ["cdi", "hook", "--bogus", "x"],
                                  ["cdi", "generate", "--link", "a::/b"], ["cdi", "hook", "--link", "-x"]])
def test_anything_else_of_cdi_goes_to_argparse(argv):
    from sandbox.flags import cdi_hook_args

    assert cdi_hook_args(argv) is None


def _python_entry(tmp_path, argv: list[str], launcher: str | None, env: dict | None = None, closed: bool = False):
    """`python -m sandbox.cli ARGV` as run() runs it, with build.installed() naming
    ``launcher`` (None: there is none); ``closed``: with its stdout closed."""
    import subprocess
    import sys

    code = ("import sys; from mounts.errors import SandboxError; from sandbox.executor import build\n"
            f"L = {launcher!r}\n"
            "def installed():\n"
            "    if L is None: raise SandboxError('no launcher here')\n"
            "    return L\n"
            "build.installed = installed\n"
            "from sandbox.cli import run; run(sys.argv[1:])")
    shell = ["sh", "-c", 'exec "$@" >&-', "sh"] if closed else []
    return subprocess.run([*shell, sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)


@pytest.fixture
def fake_launcher(tmp_path):
    """A program that says how it was called, in place of the launcher."""
    path = tmp_path / "fake-launcher"
    path.write_text('#!/bin/sh\necho "argv: $*" >&2\necho "from python: $SANDBOX_FROM_PYTHON" >&2\nexit 7\n')
    path.chmod(0o755)
    return str(path)


def test_python_hands_a_run_to_the_launcher(tmp_path, fake_launcher):
    """Python's own entry runs no container itself: it execs the launcher with the same
    command line (and its code's exit status is the launcher's), even with stdout closed."""
    import os

    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "config.json").write_text("{}")
    r = _python_entry(tmp_path, ["--root", "R", "run", "--id", "x", "B"], fake_launcher)
    assert r.returncode == 7 and r.stderr == "argv: --root R run --id x B\nfrom python: 1\n", r.stderr
    r = _python_entry(tmp_path, ["exec", "x", "true"], fake_launcher, closed=True)
    assert r.returncode == 7 and "argv: exec x true\n" in r.stderr, r.stderr
    env = dict(os.environ, SANDBOX_FROM_PYTHON="1")  # a launcher that ran Python for the verb: never again
    r = _python_entry(tmp_path, ["create", "x"], fake_launcher, env=env)
    assert r.returncode == 2 and r.stderr == f"sandbox create: only the `sandbox` launcher runs it: {fake_launcher} " \
        "ran Python for it (a launcher older than this code: scripts/setup builds it anew)\n", r.stderr


def test_without_a_launcher_python_says_why(tmp_path):
    r = _python_entry(tmp_path, ["run", "/nonexistent"], None)
    assert r.returncode == 2 and r.stderr == "sandbox run: only the `sandbox` launcher runs it: no launcher here\n", \
        r.stderr


def test_an_interpreter_without_its_path_has_no_launcher(monkeypatch, tmp_path):
    """An interpreter started with a bare argv[0] and no PATH knows no path of its own: the
    launcher is then never a `sandbox` in the cwd (an engine's cwd is the bundle)."""
    import sys

    from mounts.errors import SandboxError
    from sandbox.executor import build

    monkeypatch.setattr(sys, "executable", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sandbox").write_bytes(b"\x7fELF")
    (tmp_path / "sandbox").chmod(0o755)
    with pytest.raises(SandboxError, match="does not know its own path"):
        build.installed()


def _from_a_terminal(argv: list[str]):
    import os
    import pty
    import subprocess
    import sys

    primary, secondary = pty.openpty()
    try:
        return subprocess.run([sys.executable, "-m", "sandbox.cli", *argv], stdin=secondary, capture_output=True,
                              text=True, timeout=60)
    finally:
        os.close(primary)
        os.close(secondary)


@pytest.mark.parametrize("before, after", [(["--debug", "hook"], ["install"]),
                                           (["hook"], ["--driver-root", "/", "install"])])
def test_hook_install_from_a_terminal(before, after, make_bundle):
    """`sandbox --debug hook install B` and `sandbox hook --driver-root D install B` from a
    terminal install (the hook's own "state on stdin, not a terminal" refusal is for the hook's
    call, found past the global options, whatever options come before `install`)."""
    r = _from_a_terminal([*before, *after, str(make_bundle(["true"]))])
    assert r.returncode == 0 and "added sandbox hook" in r.stdout.lower() + r.stderr.lower(), r.stderr


def test_a_hooks_help_from_a_terminal():
    r = _from_a_terminal(["hook", "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout and "install" in r.stdout, r.stderr


@pytest.mark.parametrize("argv, name, how", [
    (["hook", "--driver-root", "/"], "sandbox hook", "`sandbox hook install BUNDLE`"),
    (["--debug", "cdi", "hook", "--link", "a::b"], "sandbox cdi hook", "from a CDI spec (`sandbox cdi generate`)")])
def test_a_hooks_call_from_a_terminal_is_refused(argv, name, how):
    """A hook's call reads the container's state on stdin: from a terminal it would wait for
    a typed one; it says so at once instead, and where such a call comes from (the CDI
    hook's call too)."""
    r = _from_a_terminal(argv)
    assert r.returncode == 2 and r.stderr.startswith(f"{name}: the container's state is read on stdin, not from a "
                                                     "terminal") and how in r.stderr, r.stderr


def test_every_verb_is_read_from_the_table():
    """One table: each verb's subparser has exactly the table's flags and positionals, and
    every namespace, the fast readers' too, has every global."""
    import argparse

    from sandbox import flags

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(flags.VERBS) == set(flags.VERB_FLAGS)
    for verb, p in sub.choices.items():
        options = {name for a in p._actions for name in a.option_strings} - {"-h", "--help"}
        assert options == {name for names, *_ in flags.VERB_FLAGS[verb] for name in names}, verb
        positionals = [a.dest for a in p._actions if not a.option_strings]
        assert positionals == [row[0] for row in flags.POSITIONALS.get(verb, (flags.ID,))], verb
    tops = {dest for _n, dest, *_ in flags.TOP}
    lines = [["features"], ["trace", "/t"], ["configure", "docker"], ["serve"], ["run", "/b"]]
    for ns in [*(parser().parse_args(a) for a in lines), flags.hook_args(["hook", "--driver-root", "/d"]),
               flags.cdi_hook_args(["cdi", "hook", "--link", "a::b"]), lean_args(["state", "c1"])]:
        assert tops <= set(vars(ns)), vars(ns)


# Which verbs' namespaces each module reads (its functions' ``args``); config.py's resolve()
# adds max_capabilities to every namespace, and run's container_id (from its target).
READERS = {"sandbox/verbs/state.py": ("list", "state", "kill", "ps"), "sandbox/launch.py": ("create", "run"),
           "sandbox/executor/create_plan.py": ("create", "run"), "sandbox/server/listen.py": ("serve", "hook"),
           "sandbox/config.py": tuple(VERBS)}


def test_each_verb_reads_only_what_its_table_gives():
    """The table is the options' type: every ``args.NAME`` a verb's code reads is a flag or a
    positional of that verb (or a global), so a misspelt or missing option fails here, not at a
    user's (options are not msgspec Structs: msgspec costs ~21 ms to import, and the verbs an
    engine runs cold, state, start, kill, delete, import none of it)."""
    import ast
    import pathlib

    from sandbox import flags

    root = pathlib.Path(__file__).resolve().parents[2]
    readers = {f"sandbox/verbs/{p.stem}.py": (p.stem,) for p in (root / "sandbox/verbs").glob("*.py")
               if p.stem in flags.VERBS} | READERS
    assert len(readers) == 17, sorted(readers)
    for path, verbs in readers.items():
        given = {"verb", "max_capabilities"} | {dest for _n, dest, *_ in flags.TOP}
        for verb in verbs:
            given |= {dest for _n, dest, *_ in flags.VERB_FLAGS[verb]}
            given |= {row[0] for row in flags.POSITIONALS.get(verb, (flags.ID,))}
            given |= {"container_id"} if verb == "run" else set()
        read = set()
        for fn in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(fn, ast.FunctionDef) and "args" in [a.arg for a in fn.args.args]:
                read |= {node.attr for node in ast.walk(fn) if isinstance(node, ast.Attribute)
                         and isinstance(node.value, ast.Name) and node.value.id == "args"}
        assert read or verbs == ("features",), path  # (features reads no option)
        assert read <= given, (path, read - given)


def test_hook_entries_name_the_launcher_not_pips_script(tmp_path, monkeypatch):
    """pip's own `sandbox` script beside the interpreter is no launcher: an entry naming it
    would run Python unisolated and never be served; installed() says so."""
    import sys

    from mounts.errors import SandboxError
    from sandbox.executor import build

    (tmp_path / "sandbox").write_text("#!/usr/bin/python\nfrom sandbox.cli import run\n")
    (tmp_path / "sandbox").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SandboxError, match="no `sandbox` launcher"):
        build.installed()
    (tmp_path / "sandbox").write_bytes(b"\x7fELF" + b"\0" * 60)
    assert build.installed() == str(tmp_path / "sandbox")


def test_only_cdi_generate_reads_the_config_file(tmp_path):
    """Our CDI spec's hook (and `cdi list`) use nothing of config.toml: a broken one fails only
    `cdi generate`, which takes the driver root from it."""
    from mounts.errors import SandboxError
    from sandbox.config import resolve
    from sandbox.flags import cdi_hook_args

    bad = tmp_path / "config.toml"
    bad.write_text("driver-root = [\n")
    hook = cdi_hook_args(["cdi", "hook", "--link", "a::b"])
    hook.config = str(bad)
    resolve(hook)
    generate = parser().parse_args(["--config", str(bad), "cdi", "generate"])
    with pytest.raises(SandboxError, match="config.toml"):
        resolve(generate)


def test_the_launchers_build_under_its_older_name(tmp_path):
    """`python -m sandbox.launcher PATH`, as install scripts and the GPU check kit call it,
    builds the same launcher as sandbox.executor.build."""
    import subprocess
    import sys

    out = tmp_path / "sandbox"
    r = subprocess.run([sys.executable, "-m", "sandbox.launcher", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and out.read_bytes()[:4] == b"\x7fELF", r.stderr
    r = subprocess.run([str(out), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("sandbox version "), r.stderr
