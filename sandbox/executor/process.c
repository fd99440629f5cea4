/* The container process's tail, as gofer/process.py's: the terminal, scheduling, LSM labels,
 * the bounding set, user and capabilities, the wait for start (a created init), the session,
 * umask, cwd, no_new_privs, signals, seccomp, the startContainer hooks, exec; and one "err"
 * line on any failure. Shared by exec's process and a created init (frontend.c). */
#include "executor.h"

int report_fd = -1;
/* What a line past start begins with, as Python's: a foreground run's "sandbox run" (its
 * launcher reports), a created init's "sandbox" (set before hide_command_line blanks argv) */
const char *line_prefix = "sandbox";
int report_waits; /* a created init's: its report goes to the builder, in its pid namespace */

/* One "err CODE MESSAGE" line to P (gofer/enter.py's report), then exit with CODE; a
 * created init past start has nobody to tell but the container's stderr (as gofer/main.py).
 * A created init waits for the builder to hang up first: pid 1's exit kills every process
 * of its pid namespace, the builder too, which would never pass the line on. */
void fail(int code, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    if (report_fd >= 0) {
        dprintf(report_fd, "err %d %s\n", code, msg);
        for (char c; report_waits;) {
            ssize_t r = read(report_fd, &c, 1);
            if (r == 0 || (r < 0 && errno != EINTR)) break;
        }
    } else
        dprintf(2, "%s: %s\n", line_prefix, msg);
    _exit(code);
}

static int kept(int fd, const int *keep, int nkeep) {
    for (int i = 0; i < nkeep; i++)
        if (keep[i] == fd) return 1;
    return 0;
}

/* Every fd from ``low`` up but the ``nkeep`` of ``keep`` closed now, not only flagged: a
 * process that waits in the container's namespaces holds nothing a ptracer in there could
 * take (close_range(2) over the gaps between the kept ones, else each fd /proc/self/fd lists);
 * and every fd of ours below ``low`` (the server's connection, say, in a gap of the engine's
 * --preserve-fds). */
void close_except(unsigned low, const int *keep, int nkeep) {
    /* below low, the engine's preserved fds: none of ours may sit in a gap between them (ours
     * are close-on-exec; a preserved one, inherited across the engine's exec, is not) */
    for (unsigned fd = 3; fd < low && fd < 1024; fd++)
        if (!kept((int)fd, keep, nkeep) && fcntl((int)fd, F_GETFD) > 0) close((int)fd);
    unsigned from = low;
    for (;;) { /* the gaps, lowest first: up to the next kept fd at or above from */
        long next = -1;
        for (int i = 0; i < nkeep; i++)
            if (keep[i] >= 0 && (unsigned)keep[i] >= from && (next < 0 || keep[i] < next)) next = keep[i];
        unsigned to = next < 0 ? ~0U : (unsigned)next - 1;
        if ((next < 0 || (unsigned)next > from) && syscall(SYS_close_range, from, to, 0) < 0) break;
        if (next < 0) return;
        from = (unsigned)next + 1;
    }
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return;
    int fds[1024], n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 1024;) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end == '\0' && end != e->d_name && fd >= (long)low && !kept((int)fd, keep, nkeep) && fd != dirfd(d))
            fds[n++] = (int)fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++) close(fds[i]);
}

/* Every fd from ``low`` up closes at exec: close_range(2), or where the kernel (before 5.11)
 * or a seccomp profile refuses it, each fd /proc/self/fd lists. -1 if neither works. */
int cloexec_from(unsigned low) {
    if (syscall(SYS_close_range, low, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */) == 0) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end == '\0' && end != e->d_name && fd >= (long)low && fd != dirfd(d)
            && fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0 && errno != EBADF) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

/* The filter; with an agent, its notification fd sent to it with the container process
 * state, as gofer.seccomp.Filter.load does. */
static void load_seccomp(struct plan *pl) {
    struct sock_fprog prog = {.len = pl->bpf_len, .filter = pl->bpf};
    unsigned flags = pl->seccomp_flags | (pl->listener >= 0 ? SECCOMP_FILTER_FLAG_NEW_LISTENER : 0);
    long fd = flags ? syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog)
                    : prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    if (fd < 0) fail(1, "seccomp_load the container's filter: %s", strerror(errno));
    if (pl->listener < 0) return;
    char *msg = malloc(strlen(pl->listener_rest) + 32);
    if (msg == NULL) fail(1, "linux.seccomp.listenerPath: cannot send the notification fd: %s", strerror(ENOMEM));
    int n = sprintf(msg, "{\"pid\":%d,%s", pl->listener_pid, pl->listener_rest);
    int notify = (int)fd;
    if (send_fds(pl->listener, msg, (size_t)n, &notify, 1, MSG_NOSIGNAL) < 0) fail(1, "linux.seccomp.listenerPath: cannot send the notification fd: %s", strerror(errno));
    close(notify);
    close(pl->listener);
    pl->listener = -1;
    free(msg);
}

/* process.scheduler, process.ioPriority and linux.personality: gofer.process.set_scheduling's
 * calls and its lines, while we still hold CAP_SYS_NICE, in the process that execs (a task
 * under SCHED_DEADLINE cannot fork). */
void set_scheduling(struct plan *pl) {
    if (pl->sched) {
        struct { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t priority; uint64_t runtime, deadline,
                 period; } attr = {sizeof attr, pl->sc.policy, pl->sc.flags, pl->sc.nice, pl->sc.priority,
                                   pl->sc.runtime, pl->sc.deadline, pl->sc.period};
        if (syscall(SYS_sched_setattr, 0, &attr, 0) < 0)
            fail(pl->code_process, "process.scheduler: sched_setattr policy %u nice %d priority %u: %s", pl->sc.policy,
                 pl->sc.nice, pl->sc.priority, strerror(errno));
    }
    if (pl->ioprio && syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, pl->ioprio_class << 13 | pl->ioprio_level) < 0)
        fail(pl->code_process, "process.ioPriority: ioprio_set class %d priority %d: %s", pl->ioprio_class,
             pl->ioprio_level, strerror(errno));
    if (pl->persona && personality(pl->persona_value) < 0)
        fail(pl->code_process, "linux.personality: personality %#lx: %s", pl->persona_value, strerror(errno));
}

/* execvpe with the PATH of the process's own environment (Python's os.execvpe), else
 * os.defpath; the first error other than "not there" is the one reported. */
static void exec_process(struct plan *pl) {
    const char *file = pl->argv[0], *path = "/bin:/usr/bin";
    for (int i = 0; i < pl->envc; i++)
        if (!strncmp(pl->envp[i], "PATH=", 5)) path = pl->envp[i] + 5;
    if (strchr(file, '/')) {
        execve(file, pl->argv, pl->envp);
        fail(pl->code_exec, "exec %s: %s", file, strerror(errno));
    }
    int saved = 0;
    char buf[4096];
    for (const char *dir = path;; dir++) {
        const char *colon = strchrnul(dir, ':');
        int len = (int)(colon - dir);
        snprintf(buf, sizeof buf, "%.*s%s%s", len, dir, len ? "/" : "", file);
        execve(buf, pl->argv, pl->envp);
        if (errno != ENOENT && errno != ENOTDIR && !saved) saved = errno;
        if (*colon == '\0') break;
        dir = colon;
    }
    fail(pl->code_exec, "exec %s: %s", file, strerror(saved ? saved : ENOENT));
}

/* A created init, its user and capabilities set: PLAN_READY to the gofer, which records the
 * container and answers with one byte (its EOF instead: it gave up, and so do we); then the
 * wait for `sandbox start`, whose byte comes through exec.fifo (open read-write: no EOF). */
static void wait_for_start(struct plan *pl) {
    char c;
    ssize_t r;
    if (dprintf(report_fd, PLAN_READY "\n") < 0) _exit(1);
    do r = read(report_fd, &c, 1); while (r < 0 && errno == EINTR);
    if (r != 1 || c != PLAN_GO[0]) _exit(1);
    close(report_fd);
    report_fd = -1;
    do r = read(pl->fifo, &c, 1); while (r < 0 && errno == EINTR);
    close(pl->fifo);
}

/* process.terminal: a pty of the container's devpts (we are in its mount namespace); the
 * master goes to the console socket as runc sends it, the slave becomes our stdio and
 * controlling terminal in a new session (gofer.process.open_console, its lines). */
static void open_console(struct plan *pl) {
    int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC), unlock = 0, slave = -1;
    if (master >= 0 && ioctl(master, TIOCSPTLCK, &unlock) == 0)
        slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC); /* (no path: the pty itself) */
    if (slave < 0)
        fail(pl->code_process, "process.terminal: cannot open a pty in the container: %s (is devpts mounted at "
             "/dev/pts?)", strerror(errno));
    struct winsize size = {.ws_row = pl->rows, .ws_col = pl->cols};
    if ((pl->rows || pl->cols) && ioctl(slave, TIOCSWINSZ, &size) < 0)
        fail(pl->code_process, "process.consoleSize: %s", strerror(errno));
    /* a deadline on the send (the server's connection was non-blocking, with one) */
    struct timeval limit = {.tv_sec = PLAN_CONSOLE_TIMEOUT_S};
    fcntl(pl->console, F_SETFL, fcntl(pl->console, F_GETFL) & ~O_NONBLOCK);
    setsockopt(pl->console, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    if (send_fds(pl->console, "/dev/ptmx", 9, &master, 1, MSG_NOSIGNAL) < 0)
        fail(pl->code_process, "--console-socket: cannot send the terminal: %s",
             errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
    close(master);
    close(pl->console);
    pl->console = -1;
    setsid();
    if (ioctl(slave, TIOCSCTTY, 0) < 0) fail(pl->code_process, "process.terminal: TIOCSCTTY: %s", strerror(errno));
    for (int fd = 0; fd < 3; fd++)
        if (dup2(slave, fd) < 0) fail(pl->code_process, "process.terminal: dup2: %s", strerror(errno));
    close(slave);
}

/* The AppArmor profile and SELinux label our next execve takes on (gofer.process.apply_labels,
 * its lines), written through the host's procfs (the container's /proc may be anything:
 * CVE-2019-16884), which is closed then: before the user changes, as runc does. */
void apply_labels(struct plan *pl) {
    static const char *const apparmor[] = {"thread-self/attr/apparmor/exec", "thread-self/attr/exec", NULL};
    static const char *const selinux[] = {"thread-self/attr/exec", NULL};
    char label[4200];
    for (int k = 0; k < 2; k++) {
        const char *value = k ? pl->selinux : pl->apparmor;
        const char *const *paths = k ? selinux : apparmor;
        if (value == NULL) continue;
        snprintf(label, sizeof label, "%s%s", k ? "" : "exec ", value);
        int fd = -1;
        const char *const *path = paths;
        for (; *path; path++)
            if ((fd = openat(pl->proc, *path, O_WRONLY | O_CLOEXEC)) >= 0 || errno != ENOENT) break;
        if (*path == NULL) fail(pl->code_process, "cannot apply '%s': no /proc/thread-self/attr here", label);
        if (fd < 0 || write(fd, label, strlen(label)) < 0)
            fail(pl->code_process, "cannot apply '%s' through /proc/%s: %s", label, *path, strerror(errno));
        close(fd);
    }
    close(pl->proc);
    pl->proc = -1;
}

/* The text of memfd ``fd``'s last line (at most the last 1 KiB), stripped, into out. */
static void last_line(int fd, char *out, size_t cap) {
    char buf[1025];
    off_t size = lseek(fd, 0, SEEK_END);
    off_t from = size > 1024 ? size - 1024 : 0;
    ssize_t r = size > 0 ? pread(fd, buf, (size_t)(size - from), from) : 0;
    size_t n = r > 0 ? (size_t)r : 0;
    while (n && strchr(" \t\r\n\v\f", buf[n - 1])) n--;
    buf[n] = '\0';
    char *line = buf;
    for (char *q = buf; *q; q++)
        if (*q == '\n' || *q == '\r') line = q + 1;
    while (*line == ' ' || *line == '\t') line++;
    snprintf(out, cap, "%s", line);
}

/* hooks.startContainer[i], as gofer.hooks.run_hooks runs a hook: the state on stdin, its
 * output kept for the error's last line, the hook's environment alone, cwd "/", umask 022,
 * no fd of ours; killed past its timeout. A failure ends pid 1 with the hook's line. */
static void run_hook(struct plan *pl, int i) {
    const char *path = pl->hooks[i].path;
    int in = memfd_create("hook-state", MFD_CLOEXEC), out = memfd_create("hook-stdout", MFD_CLOEXEC);
    int err = memfd_create("hook-stderr", MFD_CLOEXEC), status[2];
    size_t len = strlen(pl->start_state);
    if (in < 0 || out < 0 || err < 0 || write(in, pl->start_state, len) != (ssize_t)len || lseek(in, 0, SEEK_SET) < 0
        || pipe2(status, O_CLOEXEC) < 0)
        fail(1, "hooks.startContainer[%d] %s: %s", i, path, strerror(errno));
    char **argv = calloc((size_t)pl->hooks[i].nargs + 1, sizeof *argv);
    char **envp = calloc((size_t)pl->hooks[i].nenv + 1, sizeof *envp);
    if (argv == NULL || envp == NULL) fail(1, "hooks.startContainer[%d] %s: out of memory", i, path);
    memcpy(argv, pl->hook_items + pl->hooks[i].arg0, (size_t)pl->hooks[i].nargs * sizeof *argv);
    memcpy(envp, pl->hook_items + pl->hooks[i].arg0 + pl->hooks[i].nargs, (size_t)pl->hooks[i].nenv * sizeof *envp);
    pid_t pid = fork();
    if (pid == 0) {
        close(status[0]);
        umask(022);
        int s = fcntl(status[1], F_DUPFD_CLOEXEC, 3);
        if (s >= 0 && dup2(in, 0) == 0 && dup2(out, 1) == 1 && dup2(err, 2) == 2 && chdir("/") == 0) {
            close_except(3, &s, 1); /* (close_range, or /proc/self/fd where a filter refuses it) */
            execve(path, argv, envp);
        }
        int e = errno;
        if (write(s, &e, sizeof e) < 0) {}
        _exit(127);
    }
    int e = errno;
    close(status[1]);
    close(in);
    if (pid < 0) fail(1, "hooks.startContainer[%d] %s: fork: %s", i, path, strerror(e));
    ssize_t got;
    do got = read(status[0], &e, sizeof e); while (got < 0 && errno == EINTR);
    close(status[0]);
    int st = 0, pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (got != sizeof e && pl->hooks[i].timeout) {
        long ms = (long)pl->hooks[i].timeout * 1000;
        int r = 1;
        if (pidfd >= 0) {
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            do r = poll(&p, 1, ms > INT32_MAX ? -1 : (int)ms); while (r < 0 && errno == EINTR);
        } else { /* (no pidfd: a kernel before 5.3, or a filter refusing it) the exit polled, 10 ms apart */
            struct timespec tick = {0, 10 * 1000 * 1000};
            for (long waited = 0; (r = (int)waitpid(pid, &st, WNOHANG)) == 0 && waited < ms; waited += 10)
                nanosleep(&tick, NULL);
            r = r == 0 ? 0 : (r > 0 ? 2 : 1); /* (2: reaped here) */
        }
        if (r == 0) {
            kill(pid, SIGKILL);
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
            fail(1, "hooks.startContainer[%d] %s: timed out after %ds", i, path, pl->hooks[i].timeout);
        }
        if (r == 2) pid = -1;
    }
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (pidfd >= 0) close(pidfd);
    if (got == sizeof e) fail(1, "hooks.startContainer[%d] %s: %s", i, path, strerror(e));
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        char line[1025];
        last_line(lseek(err, 0, SEEK_END) > 0 ? err : out, line, sizeof line);
        fail(1, "hooks.startContainer[%d] %s: exit status %d%s%s", i, path, WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st),
             line[0] ? ": " : "", line);
    }
    close(out);
    close(err);
    free(argv);
    free(envp);
}

/* G: the process, set up as gofer/process.py's tail, become and exec_process do. */
void process(struct plan *pl) {
    if (pl->console >= 0) open_console(pl);
    if (pl->cwd >= 0 && fchdir(pl->cwd) == 0) { /* as root first (a 0700 cwd is still the process's) */
        close(pl->cwd);
        pl->cwd = -1;
    } else if (pl->cwd >= 0 && errno != EACCES && errno != EPERM) {
        fail(pl->code_process, "process.cwd %s: %s", pl->cwd_text, strerror(errno));
    }
    set_scheduling(pl);
    if (pl->proc >= 0) apply_labels(pl);
    if (pl->bpf && pl->early_seccomp) load_seccomp(pl); /* needs CAP_SYS_ADMIN: before the user changes */
    for (int cap = 0; cap <= pl->last_cap; cap++)
        if (!(pl->bounding >> cap & 1) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
            fail(1, "prctl PR_CAPBSET_DROP %d: %s", cap, strerror(errno));
    prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
    if (setgroups((size_t)pl->ngroups, pl->groups) < 0 || setgid(pl->gid) < 0 || setuid(pl->uid) < 0)
        fail(pl->code_process, "process.user: uid %u gid %u: %s", pl->uid, pl->gid, strerror(errno));
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2];
    for (int w = 0; w < 2; w++) {
        data[w].effective = (uint32_t)(pl->effective >> (32 * w));
        data[w].permitted = (uint32_t)(pl->permitted >> (32 * w));
        data[w].inheritable = (uint32_t)(pl->inheritable >> (32 * w));
    }
    if (syscall(SYS_capset, &header, data) < 0)
        fail(1, "capset effective=%llx permitted=%llx inheritable=%llx: %s", pl->effective, pl->permitted,
             pl->inheritable, strerror(errno));
    unsigned long long ambient = pl->ambient & pl->permitted & pl->inheritable;
    for (int cap = 0; cap < 64; cap++)
        if (ambient >> cap & 1 && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
            fail(1, "prctl PR_CAP_AMBIENT_RAISE %d: %s", cap, strerror(errno));
    prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0);
    if (pl->fifo >= 0) wait_for_start(pl);
    setsid();
    umask((mode_t)pl->umask);
    if (pl->cwd >= 0) {
        if (fchdir(pl->cwd) < 0) fail(pl->code_process, "process.cwd %s: %s", pl->cwd_text, strerror(errno));
        close(pl->cwd);
    }
    if (pl->nnp) prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL); /* (32 and 33 refuse: libc's own) */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (pl->bpf && !pl->early_seccomp) load_seccomp(pl); /* last: it filters the container, not us */
    for (int i = 0; i < pl->nhooks; i++) /* a created init's, after start: under its filter, as under runc */
        run_hook(pl, i);
    exec_process(pl);
}

/* The plan's namespaces joined, each fd closed; -1 with the failure's text in err. */
int join_namespaces(struct plan *pl, char *err, size_t n) {
    for (int i = 0; i < pl->nns; i++) {
        if (setns(pl->ns[i].fd, pl->ns[i].flag) < 0) {
            snprintf(err, n, "setns the container's %s namespace: %s", pl->ns[i].name, strerror(errno));
            return -1;
        }
        close(pl->ns[i].fd);
    }
    return 0;
}

void set_rlimits(struct plan *pl) {
    for (int i = 0; i < pl->nrlimits; i++) {
        struct rlimit rl = {.rlim_cur = pl->rlimits[i].soft, .rlim_max = pl->rlimits[i].hard};
        if (setrlimit(pl->rlimits[i].resource, &rl) < 0)
            fail(pl->code_bundle, "process.rlimits%s: %s", pl->rlimits[i].text, strerror(errno));
    }
}
