"""The config file: where the driver is and which capabilities a container may have at most,
for every verb that plans (create, run, plan, hook), so no engine's environment has to carry
them. ``--config FILE``, else ``$SANDBOX_CONFIG``, else /etc/gpu-sandbox/config.toml; a file
that is not there means the defaults (an explicit --config must exist).

::

    driver-root = "/run/nvidia/driver"   # default "/"
    dev-root = "/"                       # default: the driver root
    capabilities = "compute,utility"     # the ceiling; default: any
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mounts.errors import SandboxError

DEFAULT_PATH = "/etc/gpu-sandbox/config.toml"
KEYS = {"driver-root", "dev-root", "capabilities"}


class Config(NamedTuple):
    driver_root: str = "/"
    dev_root: str | None = None
    capabilities: str | None = None


def load_config(flag: str | None = None) -> Config:
    path = flag or os.environ.get("SANDBOX_CONFIG") or DEFAULT_PATH
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except FileNotFoundError:
        if flag:
            raise SandboxError(f"--config {flag}: no such file") from None
        return Config()
    except OSError as e:
        raise SandboxError(f"{path}: cannot read the config file: {e.strerror}") from None
    import tomllib

    try:
        table = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SandboxError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise SandboxError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    for key, value in table.items():
        if not isinstance(value, str) or not value or "\0" in value:
            raise SandboxError(f"{path}: {key} must be a non-empty string")
    for key in ("driver-root", "dev-root"):
        if key in table and not os.path.isabs(table[key]):
            raise SandboxError(f"{path}: {key} must be an absolute path, not {table[key]!r}")
    if "capabilities" in table:
        from mounts.request import parse_capabilities

        parse_capabilities(table["capabilities"], f"{path}: capabilities")
    return Config(table.get("driver-root", "/"), table.get("dev-root"), table.get("capabilities"))
