"""When: the command line and its verbs, the warm server, and the `sandbox` executable (its
launcher and executor)."""

from sandbox import quick_imports  # noqa: F401 - first: its quick msgspec import must precede any import of msgspec
