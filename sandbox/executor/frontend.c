/*
 * `sandbox exec` as the warm server plans it (sandbox/executor/exec_plan.py has the other half and
 * the why): the server has done all of the verb's Python (the command line, the state, the
 * bundle, the process, the checks, the namespaces' fds through a pinned /proc/<init>, the
 * cgroups' files, the seccomp filter compiled to BPF, the cwd resolved inside the container's
 * root and HOME) and sends a plan: NUL-terminated records "KEY VALUE", the fds they name as
 * SCM_RIGHTS in the same order. This process, the one the engine started, then does what
 * gofer/enter.py does, with the same three processes:
 *
 *     P (this one)               C                                G
 *     subreaper (unless detach)  cgroups, rlimits, setns user,
 *     fork ------------------>   ipc, uts, net, pid, cgroup, mnt
 *                                fork ------------------------->  the terminal, scheduling,
 *                                                                 LSM labels,
 *              <-- "pid N" ---   exit (G's pid to G, for a        drop the bounding set,
 *                                seccomp agent)                   user, capabilities,
 *              <------------------------------------ EOF at exec  setsid, umask, cwd,
 *     the report to the server         (or "err CODE MESSAGE")     no_new_privs, signals,
 *     its {"code"}: the pid file written, or the error printed     seccomp (its agent), exec
 *     detach: exit; else wait for G, pass SIGINT/TERM/HUP on, exit with its status
 *
 * The report is gofer/enter.py's, and the server reads it with the same code. A plan of any
 * size is carried out (one bigger than a message comes in a memfd). This process runs from a read-only view of the launcher (launcher.c seals it first) and is not dumpable: the
 * container never sees a host file it could write.
 *
 * `sandbox create` goes the same way (frontend_create; gofer/remote_init.py has the other
 * half): this process joins and unshares the container's namespaces and forks its pid 1,
 * whose root the server's gofer then builds from inside them; pid 1 receives the same plan
 * as exec's process, with exec.fifo, and runs the same tail, waiting for start between the
 * user change and setsid.
 *
 * The executor is three files with one header of their own (executor.h): this one (the exec
 * and create front ends: P and C, pid 1's making, the waits and reports), plan.c (the
 * records: received, unwrapped, parsed) and process.c (G's tail, shared by both).
 */
#include "executor.h"

/* C: into the container's cgroups and namespaces, then fork G. Never returns. */
static void enter(struct plan *pl) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* (the engine's command line and environment: blanked by our caller) */
    char pid[32];
    snprintf(pid, sizeof pid, "%d", getpid());
    for (int i = 0; i < pl->ncgroups; i++) {
        if (write(pl->cgroups[i].fd, pid, strlen(pid)) < 0)
            fail(1, "%s/cgroup.procs: %s", pl->cgroups[i].path, strerror(errno));
        close(pl->cgroups[i].fd);
    }
    set_rlimits(pl);
    char err[512];
    if (join_namespaces(pl, err, sizeof err) < 0) fail(1, "%s", err);
    int tell[2] = {-1, -1}; /* the pid a seccomp agent is told is the host's: only we see G's */
    if (pl->listener >= 0 && pl->listener_pid == 0 && pipe2(tell, O_CLOEXEC) < 0) fail(1, "pipe: %s", strerror(errno));
    pid_t g = fork();
    if (g < 0) fail(1, "fork: %s", strerror(errno));
    if (g > 0) {
        dprintf(report_fd, "pid %d\n", g);
        if (tell[1] >= 0 && write(tell[1], &g, sizeof g) != sizeof g) {} /* (G fails on a short read) */
        _exit(0);
    }
    if (tell[0] >= 0) {
        close(tell[1]);
        ssize_t r;
        do r = read(tell[0], &pl->listener_pid, sizeof pl->listener_pid); while (r < 0 && errno == EINTR);
        if (r != sizeof pl->listener_pid) fail(1, "linux.seccomp.listenerPath: our pid: %s", strerror(errno));
        close(tell[0]);
    }
    process(pl);
}

#define RUNNING 256 /* server_code's {"started"}: a foreground run's container runs */

static char started[512]; /* the {"started"} reply, for its id */

#define NO_ANSWER (-2) /* reply_code: nothing within the socket's SO_RCVTIMEO */

/* The server's answer on s: its {"code"}, RUNNING for {"started"} (s left open), -1 where it
 * died first, NO_ANSWER past a deadline set on s; s is closed but for RUNNING. */
static int reply_code(int s) {
    char reply[512];
    ssize_t r;
    do r = recv(s, reply, sizeof reply - 1, 0); while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        close(s);
        return NO_ANSWER;
    }
    if (r > 0) {
        reply[r] = '\0';
        if (field(reply, "started")) {
            memcpy(started, reply, (size_t)r + 1);
            return RUNNING;
        }
    }
    close(s);
    if (r <= 0) return -1;
    const char *v = field(reply, "code");
    return v ? atoi(v) & 0xff : 1;
}

/* The server's {"code"} for the verb, once it is done (s is closed here); 1 with a line
 * where it died first. A foreground run's server answers once the container has started:
 * {"started"}, RUNNING, s left open (wait_and_report). */
static int server_code(int s, const char *verb) {
    int code = reply_code(s);
    if (code < 0) {
        fprintf(stderr, "sandbox %s: the server died before it answered\n", verb);
        return 1;
    }
    return code;
}

static volatile pid_t forward_to;

static void forward(int sig) {
    if (forward_to > 0) kill(forward_to, sig);
}

/* Signals that stop a foreground run or exec (SIGINT, SIGTERM, SIGHUP) passed on to ``pid``. */
static void forward_signals(pid_t pid) {
    forward_to = pid;
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* The container's id in the server's {"started": true, "id": "ID"}, into id (an id is
 * letters, digits and _.+-: no escapes); 0 if there is none. */
static int started_id(const char *reply, char *id, size_t n) {
    const char *v = field(reply, "id");
    if (v == NULL || *v++ != '"') return 0;
    size_t len = strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-");
    if (len == 0 || len >= n || v[len] != '"') return 0;
    memcpy(id, v, len);
    id[len] = '\0';
    return 1;
}

/* Where we were before the container's namespaces (remove_container's way back): our
 * namespaces (the mount namespace last: the others are named through /proc), our cwd (a
 * relative --root is the caller's). (Our oom_score_adj is ours again once pid 1 is forked.) */
static const struct { const char *name; int flag; } host_ns[] = {
    {"pid", CLONE_NEWPID}, {"net", CLONE_NEWNET}, {"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS},
    {"cgroup", CLONE_NEWCGROUP}, {"mnt", CLONE_NEWNS}};
#define N_HOST (int)(sizeof host_ns / sizeof host_ns[0])
static int host_fds[N_HOST + 1] = {-1, -1, -1, -1, -1, -1, -1}; /* and the cwd, last */

static void keep_host(void) {
    char path[64];
    for (int i = 0; i < N_HOST; i++) {
        snprintf(path, sizeof path, "/proc/self/ns/%s", host_ns[i].name);
        host_fds[i] = open(path, O_RDONLY | O_CLOEXEC);
    }
    host_fds[N_HOST] = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* `sandbox [the run's global options] delete ID`, this program again (the server serves
 * it, else its Python does): the container's removal where the server's process that would
 * have done it is gone. We are in the container's namespaces (pivot_root took our root
 * along; our children would be in its dead pid namespace): the child is forked into our pid
 * namespace, goes back into the others and our cwd, and execs. Not --force:
 * a container of the same id made since (by an engine that deleted ours) is running, and
 * is refused, not killed. */
static void remove_container(char **argv, int verb_at, const char *id) {
    char **args = calloc((size_t)verb_at + 3, sizeof *args);
    if (args == NULL || host_fds[0] < 0 || setns(host_fds[0], CLONE_NEWPID) < 0) {
        fprintf(stderr, "sandbox run: cannot remove container %s: %s\n", id, strerror(errno));
        free(args);
        return;
    }
    for (int i = 0; i < verb_at; i++) args[i] = argv[i];
    args[verb_at] = "delete", args[verb_at + 1] = (char *)id;
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 1; i < N_HOST; i++)
            if (host_fds[i] < 0 || setns(host_fds[i], host_ns[i].flag) < 0) {
                fprintf(stderr, "sandbox run: cannot remove container %s: setns %s: %s\n", id, host_ns[i].name,
                        strerror(errno));
                _exit(127);
            }
        if (host_fds[N_HOST] >= 0 && fchdir(host_fds[N_HOST]) == 0) execv("/proc/self/exe", args);
        fprintf(stderr, "sandbox run: cannot remove container %s: %s\n", id, strerror(errno));
        _exit(127);
    }
    free(args);
    while (pid > 0 && waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* A foreground run, served: its container's pid 1 is our child, and the server's child waits
 * for its end. We pass signals on, reap it, send PLAN_STATUS " N" (the wait status), and exit with
 * the code the server answers once it has run the poststop hooks and removed the container.
 * (Gone before us, the server's child kills the container, as Python's run whose supervisor
 * died; gone before the container ends, it leaves the removal to us.) */
static int wait_and_report(int s, pid_t init, const char *id, char **argv, int verb_at) {
    int status;
    while (waitpid(init, &status, 0) < 0)
        if (errno != EINTR) {
            status = SIGKILL; /* (not ours: cannot be, we forked it and SIGCHLD is not ignored) */
            break;
        }
    forward_to = 0; /* (reaped: its pid may be another's now) */
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char line[32];
    int n = snprintf(line, sizeof line, PLAN_STATUS " %d", status);
    int answer = -1;
    if (send(s, line, (size_t)n, MSG_NOSIGNAL) < 0)
        close(s);
    else
        answer = reply_code(s);
    if (answer >= 0 && answer != RUNNING) return answer;
    if (id[0]) remove_container(argv, verb_at, id);
    return code;
}

/* The launcher's command line and environment (the engine's: its paths, perhaps its
 * secrets) blanked where /proc/<pid>/cmdline and environ read them: pid 1 waits long in the
 * container, where anyone may read its cmdline (runc's init shows "runc init"). */
static void hide_command_line(char **argv) {
    static const char name[] = "sandbox-init";
    size_t room = 0; /* the whole argument area (argv's strings lie end to end) */
    for (char **a = argv; *a; a++) room = (size_t)(*a + strlen(*a) - argv[0]);
    for (char **a = argv; *a; a++) explicit_bzero(*a, strlen(*a));
    for (char **e = environ; *e; e++) explicit_bzero(*e, strlen(*e));
    if (room >= sizeof name - 1) memcpy(argv[0], name, sizeof name - 1);
}

int frontend_exec(int s, const char *buf, size_t n, int *fds, int nfds, char **argv) {
    struct plan pl;
    if (parse(&pl, buf, n, fds, nfds) < 0) {
        fprintf(stderr, "sandbox exec: the server's plan is not one this launcher reads (rebuild both)\n");
        return 1;
    }
    if (!pl.detach) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); /* G becomes ours when C exits */
    int report[2];
    if (pipe2(report, O_CLOEXEC) < 0) {
        fprintf(stderr, "sandbox exec: pipe: %s\n", strerror(errno));
        return 1;
    }
    pid_t c = fork();
    if (c == 0) { /* C: before it joins, nothing of the caller's but stdio and the preserved fds */
        int keep[5 + PLAN_MAX_NS + PLAN_MAX_CGROUPS], nkeep = 0;
        keep[nkeep++] = report[1], keep[nkeep++] = pl.cwd, keep[nkeep++] = pl.console, keep[nkeep++] = pl.listener;
        keep[nkeep++] = pl.proc;
        for (int i = 0; i < pl.nns; i++) keep[nkeep++] = pl.ns[i].fd;
        for (int i = 0; i < pl.ncgroups; i++) keep[nkeep++] = pl.cgroups[i].fd;
        close_except(3 + (unsigned)pl.preserve, keep, nkeep);
        hide_command_line(argv);
        report_fd = report[1];
        enter(&pl);
    }
    close(report[1]);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    char text[4096];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(report[0], text + got, sizeof text - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        if (got == sizeof text - 1) break;
    }
    text[got] = '\0';
    close(report[0]);
    if (c > 0) while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {}
    pid_t g = 0;
    const char *line = strstr(text, "pid ");
    if (line == text || (line && line[-1] == '\n')) g = (pid_t)atoi(line + 4);
    int failed = strstr(text, "err ") != NULL;
    /* the server prints an error, or writes the pid file, and answers with the code: at once
     * (a deadline: a stalled server must not hold the engine's exec for good) */
    struct timeval limit = {.tv_sec = REPORT_ANSWER_S};
    int code = send(s, text, got, 0) < 0 ? (close(s), -1)
        : setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) < 0 ? (close(s), -1) : reply_code(s);
    if (code < 0) {
        if (code == NO_ANSWER)
            fprintf(stderr, "sandbox exec: the server gave no answer to the process's report in %d s\n", REPORT_ANSWER_S);
        else
            fprintf(stderr, "sandbox exec: the server died before it answered\n");
        if (g > 0 && !pl.detach) { /* a failed exec leaves no process (as runc's terminates it): ours to kill */
            kill(g, SIGKILL);
            while (waitpid(g, NULL, 0) < 0 && errno == EINTR) {}
        }
        return 1;
    }
    if (code != 0 || pl.detach) {
        if (failed && g > 0 && !pl.detach) waitpid(g, NULL, 0); /* (it exits right after its report) */
        return code;
    }
    forward_signals(g);
    int status;
    while (waitpid(g, &status, 0) < 0)
        if (errno != EINTR) return 1;
    forward_to = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}


/* The created init (served create): the launcher's child, pid 1 of the container's new pid
 * namespace. The gofer builds its root from inside its namespaces (pivot_root takes this
 * process's root along) and sends the process on ``chan``: the same plan as exec's, with
 * exec.fifo. Never returns. */
static void init_process(int chan) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    report_fd = chan, report_waits = 1;
    char *buf = malloc(MAX_REQUEST + 1);
    int fds[MAX_FDS], nfds = 0;
    ssize_t r = buf != NULL ? recv_plan(chan, buf, MAX_REQUEST, fds, &nfds, 0) : -1;
    if (r < 0 && errno == EMSGSIZE) /* (fds cut short: rlimits set before a user namespace) */
        fail(1, "the container's init could not receive its plan: %s (process.rlimits' RLIMIT_NOFILE?)",
             strerror(errno));
    if (r <= 0) _exit(1); /* the gofer gave up before the plan (it says why) */
    struct plan pl;
    size_t n = (size_t)r;
    const char *records = plan_records(buf, &n, fds, &nfds);
    if (records == NULL || parse(&pl, records, n, fds, nfds) < 0 || pl.fifo < 0 || !pl.root_set)
        fail(1, "the server's plan for the init is not one this launcher reads (rebuild both)");
    struct stat root;
    if (stat("/", &root) < 0 || root.st_dev != pl.root_dev || root.st_ino != pl.root_ino)
        fail(1, "the container's init kept a root of the host's (a chrooted launcher?)");
    set_rlimits(&pl);
    process(&pl);
}

/* A new user namespace's map for ``pid``, written from ours (the launcher is the host's
 * root, as Python's keeper is): 0, or -1 with the report's line in ``report``. */
static int write_map(pid_t pid, const char *name, const char *field, const char *data, char *report, size_t n) {
    char path[64], shown[1024];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    size_t len = strlen(data), o = 0;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && write(fd, data, len) == (ssize_t)len) {
        close(fd);
        return 0;
    }
    int e = errno;
    if (fd >= 0) close(fd);
    for (size_t i = 0; i < len && o < sizeof shown - 3; i++) /* (Python's repr of the stripped map) */
        if (data[i] != '\n') shown[o++] = data[i];
        else if (i + 1 < len) shown[o++] = '\\', shown[o++] = 'n';
    shown[o] = '\0';
    snprintf(report, n, "err 1 %s: %s: cannot write '%s': %s\n", field, path, shown, strerror(e));
    return -1;
}

/* Our root and cwd the new mount namespace's root, as the builder's are once it has joined
 * it (setns resets them), before pid 1 is forked (it inherits them; done in pid 1, it raced
 * the builder's pivot_root under load: a root looked up just before the pivot, set just
 * after it, was the host's). A chrooted launcher's root is not the one the pivot_root takes
 * along. Best effort (it takes CAP_SYS_CHROOT): pid 1's root check refuses a root that was
 * not taken along. */
static void own_mount_root(void) {
    int mnt = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (mnt >= 0) {
        if (setns(mnt, CLONE_NEWNS) < 0) {}
        close(mnt);
    }
}

/* create with a user namespace (runc's nsexec order; gofer/userns.py's in Python): a child Y
 * sets the rlimits and the scheduling that take the host's privileges, joins the namespaces
 * named by path, enters the user namespace (a new one, its maps written here; or the one
 * named), becomes its root, unshares the rest and forks pid 1, tells us its pid and exits:
 * pid 1 comes back to us, a subreaper. Its pid, or -1 with the report's line in report. */
static pid_t userns_init(struct plan *pl, int *chan, char **argv, char *report, size_t n) {
    int sync[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0
        || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        snprintf(report, n, "err 1 cannot make the user namespace's first process: %s\n", strerror(errno));
        return -1;
    }
    pid_t y = fork();
    if (y == 0) {
        close(sync[0]);
        report_fd = sync[1], report_waits = 0;
        set_rlimits(pl);
        set_scheduling(pl);
        /* a user namespace named by path first (runc's order, gofer/userns.py's): the others
         * are then joined as its root; a new one is made after them, as runc's nsexec does */
        int user = -1;
        for (int i = 0; i < pl->nns; i++)
            if (pl->ns[i].flag == CLONE_NEWUSER) user = i;
        if (user >= 0 && setns(pl->ns[user].fd, CLONE_NEWUSER) < 0)
            fail(1, "setns the container's user namespace: %s", strerror(errno));
        for (int i = 0; i < pl->nns; i++) {
            if (i == user) continue;
            if (setns(pl->ns[i].fd, pl->ns[i].flag) < 0)
                fail(1, "setns the container's %s namespace: %s", pl->ns[i].name, strerror(errno));
            close(pl->ns[i].fd);
        }
        char c = 'u';
        if (user < 0 && unshare(CLONE_NEWUSER) < 0)
            fail(1, "linux.namespaces: cannot create the container's user namespace: %s", strerror(errno));
        if (user < 0 && (write(sync[1], &c, 1) != 1 || read(sync[1], &c, 1) != 1 || c != 'm'))
            _exit(1); /* (the launcher says why) */
        if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0 || setgroups(0, NULL) < 0)
            fail(1, "linux.uidMappings: cannot become the container's root: %s", strerror(errno));
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* (the change of credentials made us dumpable) */
        if (unshare(pl->unshare & ~CLONE_NEWUSER) < 0)
            fail(1, "linux.namespaces: cannot create the container's namespaces: %s", strerror(errno));
        own_mount_root();
        if (chdir("/") < 0) fail(1, "chdir /: %s", strerror(errno));
        pid_t init = fork();
        if (init < 0) fail(1, "fork: %s", strerror(errno));
        if (init == 0) {
            close_except(3 + (unsigned)pl->preserve, &chan[1], 1);
            hide_command_line(argv);
            init_process(chan[1]);
        }
        dprintf(sync[1], "pid %d\n", (int)init);
        _exit(0);
    }
    int e = errno;
    close(sync[1]);
    char got[2048];
    ssize_t r = -1;
    if (y < 0) {
        snprintf(report, n, "err 1 fork: %s\n", strerror(e));
    } else {
        do r = recv(sync[0], got, sizeof got - 1, 0); while (r < 0 && errno == EINTR);
        if (r == 1 && got[0] == 'u') {
            if (write_map(y, "uid_map", "linux.uidMappings", pl->uid_map ? pl->uid_map : "", report, n) < 0
                || write_map(y, "gid_map", "linux.gidMappings", pl->gid_map ? pl->gid_map : "", report, n) < 0) {
                kill(y, SIGKILL);
                r = 0;
            } else if (send(sync[0], "m", 1, 0) == 1) {
                do r = recv(sync[0], got, sizeof got - 1, 0); while (r < 0 && errno == EINTR);
            }
        }
        while (waitpid(y, NULL, 0) < 0 && errno == EINTR) {}
    }
    close(sync[0]);
    if (r > 4 && !strncmp(got, "pid ", 4)) return (pid_t)atoi(got + 4);
    if (r > 0) {
        got[r] = '\0';
        snprintf(report, n, "%s", got); /* (Y's "err CODE MESSAGE") */
    } else if (!report[0]) {
        snprintf(report, n, "err 1 the user namespace's first process exited before it made the container's init\n");
    }
    return -1;
}

/* create, served: the server's "clone" records (the namespaces to join, by fd, and the
 * flags to unshare, the oom_score_adj, the --preserve-fds) are carried out here, in the
 * process the engine started, which is in the container's cgroups already; then its child,
 * the container's pid 1, waits for its plan (init_process). The gofer gets "pid N" with the
 * channel to it, or "err CODE MESSAGE"; the server then answers with the exit code. */
int frontend_create(int s, const char *buf, size_t n, int *fds, int nfds, char **argv, int verb_at) {
    const char *verb = argv[verb_at];
    if (!strcmp(verb, "run")) line_prefix = "sandbox run";
    static struct plan pl; /* (its tables are large; this process makes one) */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* before any namespace of the container's (pid 1 inherits it) */
    if (parse(&pl, buf, n, fds, nfds) < 0 || !pl.clone) {
        fprintf(stderr, "sandbox %s: the server's plan is not one this launcher reads (rebuild both)\n", verb);
        return 1;
    }
    char report[2048];
    int chan[2] = {-1, -1};
    pid_t init = -1;
    report[0] = '\0';
    char err[512];
    if (cloexec_from(3 + (unsigned)pl.preserve) < 0)
        snprintf(report, sizeof report, "err 1 cannot close our fds at exec: %s\n", strerror(errno));
    if (!strcmp(verb, "run")) keep_host(); /* (before the oom_score_adj and the namespaces) */
    /* pid 1 inherits the container's oom_score_adj from us; we take ours back once it is forked
     * (a foreground run's launcher lives as long as the container, and is no process of its) */
    char own_oom[16] = "";
    if (pl.oom_set && !report[0]) {
        int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, own_oom, sizeof own_oom - 1) : -1;
        own_oom[got > 0 ? got : 0] = '\0';
        if (fd < 0 || got <= 0 || dprintf(fd, "%ld", pl.oom) < 0)
            snprintf(report, sizeof report, "err 1 process.oomScoreAdj %ld: %s\n", pl.oom, strerror(errno));
        if (fd >= 0) close(fd);
    }
    int userns = pl.unshare & CLONE_NEWUSER;
    for (int i = 0; i < pl.nns; i++)
        userns |= pl.ns[i].flag == CLONE_NEWUSER;
    if (userns && !report[0] && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, chan) < 0)
        snprintf(report, sizeof report, "err 1 socketpair: %s\n", strerror(errno));
    if (userns && !report[0]) {
        init = userns_init(&pl, chan, argv, report, sizeof report);
        for (int i = 0; i < pl.nns; i++) /* (Y's to join) */
            close(pl.ns[i].fd);
    }
    if (!userns && !report[0] && join_namespaces(&pl, err, sizeof err) < 0)
        snprintf(report, sizeof report, "err 1 %s\n", err);
    if (!userns && !report[0] && unshare(pl.unshare) < 0)
        snprintf(report, sizeof report, "err 1 linux.namespaces: cannot create the container's namespaces: %s\n",
                 strerror(errno));
    /* "/" of the new mount namespace: pivot_root moves a cwd there into the container's root,
     * where our caller's (a host directory) would stay reachable through pid 1's cwd */
    if (!userns && !report[0] && (pl.unshare & CLONE_NEWNS)) own_mount_root();
    if (!userns && !report[0] && chdir("/") < 0)
        snprintf(report, sizeof report, "err 1 chdir /: %s\n", strerror(errno));
    if (!userns && !report[0] && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, chan) < 0)
        snprintf(report, sizeof report, "err 1 socketpair: %s\n", strerror(errno));
    if (!userns && !report[0] && (init = fork()) < 0)
        snprintf(report, sizeof report, "err 1 fork: %s\n", strerror(errno));
    if (init == 0) { /* everything but the engine's --preserve-fds closed, not only flagged: it waits long */
        close_except(3 + (unsigned)pl.preserve, &chan[1], 1); /* (ours too: the host's namespaces and
                                                               * cwd, the server's connection, chan[0]) */
        hide_command_line(argv);
        init_process(chan[1]);
    }
    if (own_oom[0]) { /* (back down to where it was: the kernel lets a process do that) */
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if ((fd < 0 || write(fd, own_oom, strlen(own_oom)) < 0) && !report[0])
            snprintf(report, sizeof report, "err 1 oom_score_adj %s, the launcher's own again: %s\n", own_oom,
                     strerror(errno));
        if (fd >= 0) close(fd);
    }
    /* (the namespaces' fds: closed as they were joined; their numbers may be chan's now) */
    if (!report[0]) snprintf(report, sizeof report, "pid %d\n", init);
    if (init > 0) close(chan[1]);
    /* a run's signals go to the container from now on, as Python's run passes them on (its
     * poststart hooks run after it has exec'd; before, an init without a handler ignores them) */
    if (init > 0 && strcmp(verb, "run") == 0) forward_signals(init);
    ssize_t sent = send_fds(s, report, strlen(report), &chan[0], init > 0 ? 1 : 0, 0);
    if (chan[0] >= 0) close(chan[0]);
    int code = sent >= 0 ? server_code(s, verb) : (close(s), 1);
    char id[256] = "";
    if (code == RUNNING && init > 0) { /* a run's: ours to wait for */
        if (!started_id(started, id, sizeof id)) id[0] = '\0';
        return wait_and_report(s, init, id, argv, verb_at);
    }
    if (code != 0 && init > 0) { /* (it gives up on its own at the gofer's EOF; a zombie left to the engine would not) */
        kill(init, SIGKILL);
        while (waitpid(init, NULL, 0) < 0 && errno == EINTR) {}
    }
    return code == RUNNING ? 1 : code;
}
