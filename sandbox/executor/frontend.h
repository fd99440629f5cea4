/* The exec and create front end (frontend.c), called by the launcher (launcher.c) with the server's plan. */
#ifndef SANDBOX_FRONTEND_H
#define SANDBOX_FRONTEND_H
#include <stddef.h>

#include "server_wire.h"

#include <sys/types.h>

#include SANDBOX_CONFIG /* PLAN_*: gofer/frontend_plan.py's limits, as sandbox/executor/build.py writes them */
#define MAX_FDS PLAN_MAX_FDS

/* One message of records from s with its fds (close-on-exec), into buf (cap bytes and a NUL,
 * NUL-terminated), recvmsg's flags added: its length, 0 at EOF, or -1 with errno (EAGAIN
 * past an SO_RCVTIMEO; EMSGSIZE for a message or fds cut short: nothing kept). */
ssize_t recv_plan(int s, char *buf, size_t cap, int *fds, int *nfds, int flags);

/* data (n bytes) on s with nfds (at most 4) fds as SCM_RIGHTS, sendmsg's flags: sendmsg's
 * result (EINTR retried). */
ssize_t send_fds(int s, const void *data, size_t n, const int *fds, int nfds, int flags);

/* The records of a plan as received (buf, *n; fds, *nfds): buf itself, or where the message
 * is "memfd" (a plan too big for one message), the contents of its first fd, which is closed
 * and taken off fds; NULL for a memfd that cannot be read (or holds a "memfd" again). */
const char *plan_records(const char *buf, size_t *n, int *fds, int *nfds);

/* Runs the plan (buf, n; fds as received) on the server's connection s: the exit code of
 * `sandbox exec`, the process's own when not detached. argv: the command line, blanked in
 * the child that joins the container. */
int frontend_exec(int s, const char *buf, size_t n, int *fds, int nfds, char **argv);

/* The same for create's and run's "clone" records: the container's pid 1 made here, as the
 * launcher's child (the server's gofer builds its root and sends it its process). The exit
 * code: create's, or a foreground run's container's (this process waits for it). argv: the
 * command line (NULL-terminated), its verb at argv[verb_at]. */
int frontend_create(int s, const char *buf, size_t n, int *fds, int nfds, char **argv, int verb_at);

#endif
