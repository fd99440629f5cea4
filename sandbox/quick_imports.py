"""Start-up cost: msgspec without typing_extensions. Installed by importing this package
(sandbox/__init__.py), before anything imports msgspec; the packages below (mounts/,
gofer/) change nothing of the interpreter when imported on their own."""

import sys

# the import system's own path finder (importlib.machinery.PathFinder, without importing it)
PathFinder = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")


class _QuickMsgspec:
    """Start-up cost: msgspec imports typing_extensions (~20 ms here, most of it `inspect`)
    only for get_type_hints and Required/NotRequired, which Python 3.11's typing provides;
    when that import fails msgspec uses typing's. This one-shot finder hides the module while
    msgspec's package executes, on msgspec's first import, and only then: the verbs that never
    touch msgspec (start, state, kill, delete) pay nothing. Anything imported later still gets
    the real typing_extensions."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "msgspec":
            return None
        sys.meta_path.remove(cls)
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_hidden(module):
            hide = "typing_extensions" not in sys.modules
            if hide:
                sys.modules["typing_extensions"] = None  # type: ignore[assignment]
            try:
                exec_module(module)
            finally:
                if hide:
                    del sys.modules["typing_extensions"]

        spec.loader.exec_module = exec_hidden  # type: ignore[method-assign]  # deliberate one-shot wrap
        return spec


if "msgspec" not in sys.modules and _QuickMsgspec not in sys.meta_path:
    sys.meta_path.insert(0, _QuickMsgspec)
