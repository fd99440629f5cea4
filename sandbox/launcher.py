"""``python -m sandbox.launcher PATH [--strip DESTDIR]``: the launcher's build under the name it
had before sandbox/executor/ (install scripts written then, and the GPU check kit, call it so).
The build is sandbox/executor/build.py's."""

if __name__ == "__main__":
    import sys

    from sandbox.executor.build import write_launcher

    write_launcher(sys.argv[1], sys.argv[3] if sys.argv[2:3] == ["--strip"] else "")
