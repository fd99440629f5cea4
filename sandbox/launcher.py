"""The `sandbox` executable as engines run it, once per verb per container: Python isolated
and without site (``-IS``: no PYTHON* variables, no user site, no cwd on sys.path, and ~3 ms
less per start), with this installation's import paths baked in. `scripts/setup` writes it
over pip's console script; `sandbox hook install` puts the same program in a hook entry.

It is sandbox/launcher.c, built here with the interpreter and the program baked in: it runs
the interpreter from a read-only view of itself (CVE-2019-5736, see there), and has the warm
server run the verbs that start no process (SERVED, sandbox/server_client.py). Without a C
compiler it is a ``#!`` script, and sandbox/sealed.py seals the verbs that need it.

    python -m sandbox.launcher PATH [--strip DESTDIR]
                                        writes the launcher to PATH (naming the interpreter and
                                        the import paths without DESTDIR: a staged install's)
"""

from __future__ import annotations

import os
import sys

MAIN = "from sandbox.cli import run; run(sys.argv[1:])"
MARK = "from sandbox.cli import"  # what tells our hook entries (this MAIN or an older one) apart


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


def c_string(text: str) -> str:
    """``text`` as a C string literal: printable ASCII as it is, every other byte in octal."""
    out = []
    for b in text.encode():
        ch = chr(b)
        out.append(ch if 32 <= b < 127 and ch not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def write_launcher(path: str, strip: str = "") -> None:
    import shutil
    import subprocess
    import tempfile

    from sandbox.flags import GLOBAL_VALUES
    from sandbox.server_client import SERVED

    cc = shutil.which("cc") or shutil.which("gcc")
    # built in a private directory beside it (no name anyone could plant a link at), then
    # renamed into place whole
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as d:
        tmp = os.path.join(d, "sandbox")
        if cc is None:
            with open(tmp, "w") as f:
                f.write(f"#!{_unstaged(sys.executable, strip)} -IS\nimport sys\n"
                        f"sys.path[:0] = {[_unstaged(p, strip) for p in import_paths()]!r}\n{MAIN}\n")
        else:
            source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")
            config = os.path.join(d, "config.h")
            from gofer.frontend_plan import c_defines

            with open(config, "w") as f:
                f.write(c_defines())
                f.write(f"#define SANDBOX_PYTHON {c_string(_unstaged(sys.executable, strip))}\n"
                        f"#define SANDBOX_CODE {c_string(entry_code(strip))}\n"
                        f"#define SANDBOX_SERVED {', '.join(map(c_string, SERVED))}\n"
                        f"#define SANDBOX_GLOBAL_VALUES {', '.join(map(c_string, GLOBAL_VALUES))}\n")
            subprocess.run([cc, "-O2", "-Wall", "-Werror", f'-DSANDBOX_CONFIG="{config}"', "-o", tmp, source,
                            os.path.join(os.path.dirname(source), "frontend.c")], check=True)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)


if __name__ == "__main__":
    write_launcher(sys.argv[1], sys.argv[3] if sys.argv[2:3] == ["--strip"] else "")
