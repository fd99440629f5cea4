"""What to mount: pure computation (no side effects on the host)."""

import sys

# Start-up cost: msgspec imports typing_extensions (~20 ms here, most of it `inspect`) only
# for get_type_hints and Required/NotRequired, which Python 3.11's typing provides; when the
# import fails msgspec uses typing's. Hide the module while msgspec loads so it takes that
# fallback; everything imported later (anyio) still gets the real typing_extensions.
if "msgspec" not in sys.modules and "typing_extensions" not in sys.modules:
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]
