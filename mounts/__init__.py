"""What to mount: pure computation (no side effects on the host)."""

OCI_VERSION = "1.0.2"  # the runtime spec's version we write (states, hooks, features)
