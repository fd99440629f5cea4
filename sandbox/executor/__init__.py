"""The `sandbox` executable in C: the launcher (launcher.c) and its executor (frontend.c, plan.c,
process.c), and build.py, which compiles them with the wire's header."""
