"""The warm server: listen (the socket, the accept loop, its children), trust (whom it serves),
requests (one request, in a child) and cache (the seccomp filters)."""
