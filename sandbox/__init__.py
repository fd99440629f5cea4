"""When: the CLI verbs and the async supervisor."""

from sandbox import quick_imports  # noqa: F401 - first: its quick msgspec import must precede any import of msgspec
