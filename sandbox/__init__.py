"""When: the CLI verbs and the async supervisor."""

import mounts  # noqa: F401 - first: its quick msgspec import must precede any import of msgspec
