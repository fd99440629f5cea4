"""The verbs, one module each: main(args) (run, create and exec: main(args, frontend), planned
for the launcher to carry out). sandbox/cli.py calls them."""
