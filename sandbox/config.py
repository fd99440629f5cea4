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

from mounts.errors import SandboxError

DEFAULT_PATH = "/etc/gpu-sandbox/config.toml"
KEYS = {"driver-root", "dev-root", "capabilities"}


class Config:
    """The file's values (a plain class: the verbs that resolve no config import no typing)."""

    __slots__ = ("driver_root", "dev_root", "capabilities")

    def __init__(self, driver_root: str = "/", dev_root: str | None = None, capabilities: str | None = None):
        self.driver_root, self.dev_root, self.capabilities = driver_root, dev_root, capabilities


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


def resolve(args) -> None:
    """Fill what the command line (sandbox/flags.py) left open: the config file's driver root, device root and
    capability ceiling, then the defaults; runc's run (ID) or ours (BUNDLE)."""
    if args.root is None:
        from sandbox.flags import DEFAULT_ROOT

        args.root = DEFAULT_ROOT
    args.max_capabilities = None
    if args.verb in ("create", "run", "plan", "hook") or (args.verb == "cdi" and args.action == "generate"):
        conf = load_config(args.config)
        if args.driver_root is None:
            args.driver_root = conf.driver_root
        if args.dev_root is None:
            args.dev_root = conf.dev_root
        args.max_capabilities = conf.capabilities
        if args.verb == "hook" and args.capabilities is None:
            args.capabilities = conf.capabilities
    if args.verb == "run":
        # runc's `run [-b B] ID`, or ours: `run BUNDLE` (a directory, or anything with a /,
        # which no container id has: a missing bundle is then said to be one)
        if args.bundle is None and ("/" in args.target or os.path.isdir(args.target)):
            args.bundle = args.target
            args.container_id = args.id
        else:
            args.container_id = args.target
            if args.bundle is None and not os.path.exists("config.json"):
                from mounts.errors import BundleError

                raise BundleError(f"{args.target}: no such bundle directory, and the current directory "
                                  f"{os.getcwd()} has no config.json for runc's `run ID` (sandbox run BUNDLE, "
                                  "or run -b BUNDLE ID)")
    elif args.verb == "create":
        args.detach = True
