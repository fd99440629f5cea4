"""``python -m sandbox.launcher PATH [--strip DESTDIR]``: the launcher's build under the name it
had before sandbox/executor/ (install scripts written then, and the GPU check kit, call it so):
sandbox/executor/build.py run as the program."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("sandbox.executor.build", run_name="__main__", alter_sys=True)
