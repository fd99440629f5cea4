"""The `sandbox` executable as engines run it, once per verb per container: Python isolated
and without site (``-IS``: no PYTHON* variables, no user site, no cwd on sys.path, and ~3 ms
less per start), with this installation's import paths baked in. `scripts/setup` writes it
over pip's console script; `sandbox hook install` puts the same program in a hook entry.

    python -m sandbox.launcher PATH     writes the launcher to PATH
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


def entry_code() -> str:
    """The program, for ``python -I -S -c``."""
    return f"import sys; sys.path[:0] = {import_paths()!r}; {MAIN}"


def write_launcher(path: str) -> None:
    code = f"#!{sys.executable} -IS\nimport sys\nsys.path[:0] = {import_paths()!r}\n{MAIN}\n"
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(code)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


if __name__ == "__main__":
    write_launcher(sys.argv[1])
