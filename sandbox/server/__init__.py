"""The warm server: listen (the socket, the accept loop, its children), trust (whom it serves),
requests (one request, in a child), cache (the seccomp filters), wire (what C and Python share),
and the planners of exec and create (exec_plan, create_plan)."""
