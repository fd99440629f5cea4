/* The executor's own header (frontend.c, plan.c, process.c): the plan as parsed, and what the
 * three share. The launcher includes frontend.h alone. */
#ifndef SANDBOX_EXECUTOR_H
#define SANDBOX_EXECUTOR_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "frontend.h"

extern char **environ;

struct plan {
    int detach, preserve, nnp, early_seccomp, last_cap, umask;
    int clone, unshare, oom_set; /* create's "clone" records (frontend_create) */
    long oom;
    int code_process, code_exec, code_bundle;
    unsigned long long bounding, permitted, inheritable, effective, ambient;
    unsigned uid, gid;
    gid_t *groups;
    int ngroups;
    struct rlimit_item { int resource; rlim_t soft, hard; const char *text; } *rlimits;
    int nrlimits;
    struct { int fd, flag; const char *name; } ns[PLAN_MAX_NS];
    int nns;
    struct { int fd; const char *path; } cgroups[PLAN_MAX_CGROUPS];
    int ncgroups;
    int cwd, fifo, console; /* console: the --console-socket's connection */
    int proc; /* the host's procfs, for the labels */
    const char *apparmor, *selinux;
    unsigned short rows, cols;
    const char *cwd_text;
    struct sock_filter *bpf;
    unsigned short bpf_len;
    unsigned seccomp_flags;
    int listener, listener_pid; /* a seccomp agent's connection, the pid it is told (0: G's, from C) */
    const char *listener_rest; /* the message to it, past {"pid":N, */
    int sched, ioprio, persona; /* each set: its record came */
    struct { unsigned policy, priority; unsigned long long flags, runtime, deadline, period; int nice; } sc;
    int ioprio_class, ioprio_level;
    unsigned long persona_value;
    char **argv, **envp; /* NULL-terminated */
    int argc, envc;
    /* a created init's startContainer hooks: each one's argv, then its environment, in items */
    struct hook { const char *path; int timeout, arg0, nargs, nenv; } *hooks;
    int nhooks, nhook_items;
    char **hook_items;
    const char *start_state; /* what they read on stdin */
    const char *uid_map, *gid_map; /* a new user namespace's, written by the launcher */
    unsigned long long root_dev, root_ino; /* a created init's root, as the builder sees it */
    int root_set;
};

/* where a failure's "err CODE MESSAGE" goes (-1: stderr, with line_prefix), and whether the
 * builder is waited for first (a created init's): process.c's */
extern int report_fd, report_waits;
extern const char *line_prefix;

/* plan.c: the records into pl; -1 on anything malformed */
int parse(struct plan *pl, const char *buf, size_t n, int *fds, int nfds);

/* process.c: the process's tail and what the front ends share of it */
void fail(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
void close_except(unsigned low, const int *keep, int nkeep);
int cloexec_from(unsigned low);
void set_scheduling(struct plan *pl);
void apply_labels(struct plan *pl);
void process(struct plan *pl); /* (never returns: it execs or fails) */
int join_namespaces(struct plan *pl, char *err, size_t n);
void set_rlimits(struct plan *pl);

#endif
