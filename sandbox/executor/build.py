"""The `sandbox` executable as engines run it, once per verb per container: Python isolated
and without site (``-IS``: no PYTHON* variables, no user site, no cwd on sys.path, and ~3 ms
less per start), with this installation's import paths baked in. `scripts/setup` writes it
over pip's console script; `sandbox hook install` and `sandbox cdi generate` put the same
program in hook entries.

It is sandbox/executor/launcher.c, built here with the interpreter and the program baked in: it runs
from a sealed view of itself (CVE-2019-5736, see there), has the warm server run the verbs
that start no process (SERVED), and carries out the plans of exec, create and run (its
executor: frontend.c, plan.c, process.c). A C compiler is needed to install sandbox.

    python -m sandbox.executor.build PATH [--strip DESTDIR]
                                        writes the launcher to PATH (naming the interpreter and
                                        the import paths without DESTDIR: a staged install's)

It is built with the header sandbox/executor/wire.py writes (the wire's numbers, the plan's tables).
"""

from __future__ import annotations

import os
import sys

MAIN = "from sandbox.cli import run; run(sys.argv[1:])"


def installed() -> str:
    """The launcher of this installation, as hook entries and engines' configs name it:
    beside the interpreter (a checkout's .venv/bin/sandbox), or where the link there leads
    (an installation's PREFIX/bin/sandbox: scripts/install links venv/bin/sandbox to it)."""
    from mounts.errors import SandboxError

    path = os.path.join(os.path.dirname(sys.executable), "sandbox")
    if not os.path.isabs(path):  # (an interpreter that does not know where it is: never the cwd's)
        raise SandboxError(f"the interpreter does not know its own path ({sys.executable!r}): no `sandbox` "
                           "launcher beside it")
    try:
        with open(path, "rb") as f:
            launcher = f.read(4) == b"\x7fELF" and os.access(path, os.X_OK)
    except OSError:
        launcher = False
    if not launcher:  # (pip's own script there runs Python unisolated, and never a server)
        raise SandboxError(f"{path}: no `sandbox` launcher beside the interpreter (scripts/setup or scripts/install "
                           "writes it; python -m sandbox.executor.build PATH)")
    if os.path.islink(path):
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return path


def import_paths() -> list[str]:
    """Where our dependencies and our packages were imported from (not sysconfig's idea of
    site-packages: under -S, as in this very launcher, that is the base interpreter's)."""
    import msgspec

    import sandbox

    deps = os.path.dirname(os.path.dirname(os.path.abspath(msgspec.__file__)))
    here = os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__)))
    return list(dict.fromkeys([deps, here]))


def entry_code(strip: str = "") -> str:
    """The program, for ``python -I -S -c``."""
    return f"import sys; sys.path[:0] = {[_unstaged(p, strip) for p in import_paths()]!r}; {MAIN}"


def _unstaged(path: str, strip: str) -> str:
    return path[len(strip):] if strip and path.startswith(strip + "/") else path


def write_launcher(path: str, strip: str = "") -> None:
    """The launcher at ``path``: launcher.c and its executor built with this installation's
    interpreter and program."""
    from sandbox.executor.wire import c_string
    from sandbox.flags import GLOBAL_VALUES

    _build(path, ["launcher.c", "frontend.c", "plan.c", "process.c"],
           f"#define SANDBOX_PYTHON {c_string(_unstaged(sys.executable, strip))}\n"
           f"#define SANDBOX_CODE {c_string(entry_code(strip))}\n"
           f"#define SANDBOX_GLOBAL_VALUES {', '.join(map(c_string, GLOBAL_VALUES))}\n")


def _cc() -> str | None:
    import shutil

    return shutil.which("cc") or shutil.which("gcc")


def _build(path: str, sources: list[str], config: str, defines: tuple[str, ...] = ()) -> None:
    """``sources`` (of this directory) compiled into ``path``, with the wire's header
    (sandbox/executor/wire.py) and ``config`` as the SANDBOX_CONFIG they include."""
    import subprocess
    import tempfile

    from sandbox.executor.wire import c_header

    cc = _cc()
    if cc is None:
        raise OSError(f"{path}: no C compiler (cc or gcc) to build it with")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        header, out = os.path.join(d, "config.h"), os.path.join(d, "program")
        with open(header, "w") as f:
            f.write(f"#ifndef SANDBOX_CONFIG_H\n#define SANDBOX_CONFIG_H\n{c_header()}{config}#endif\n")
        command = [cc, "-O2", "-Wall", "-Werror", f'-DSANDBOX_CONFIG="{header}"', *(f"-D{x}" for x in defines),
                   "-o", out, *(os.path.join(here, s) for s in sources)]
        # static (and position-independent: still ASLR), where the C library has its static
        # archive: no dynamic loader at each of its starts (a verb's, twice for run, create
        # and exec: docs/benchmarks.md); a link warning (a libc call that would need its
        # shared parts at run time) refuses it. Else linked as usual, and said so in a line.
        static = subprocess.run([*command, "-fPIE", "-static-pie", "-Wl,--fatal-warnings"], capture_output=True,
                                text=True)
        if static.returncode:
            why = (static.stderr.strip().splitlines() or ["?"])[-1]
            print(f"sandbox: the launcher is linked dynamically (no static link: {why})", file=sys.stderr)
            subprocess.run(command, check=True)
        with open(out, "rb") as f:
            _install(path, f.read())


def _install(path: str, data: bytes) -> None:
    """``data`` as the executable ``path``: written in a private directory beside it (no name
    anyone could plant a link at), then renamed into place whole."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as d:
        tmp = os.path.join(d, "program")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)


if __name__ == "__main__":
    write_launcher(sys.argv[1], sys.argv[3] if sys.argv[2:3] == ["--strip"] else "")
