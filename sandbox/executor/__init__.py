"""The `sandbox` executable and what it is sent: the launcher (launcher.c) and its executor
(frontend.c, plan.c, process.c), built by build.py with the header wire.py writes (what C and
Python share); the plans of exec and create (exec_plan, create_plan) it carries out."""
