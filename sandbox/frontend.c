/*
 * `sandbox exec` as the warm server plans it (sandbox/exec_frontend.py has the other half and
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
 */
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

/* a plan sent in a memfd ("memfd", its fd first): at most this many bytes */
#define MAX_PLAN_FILE (64 << 20)

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

static int report_fd = -1;
/* What a line past start begins with, as Python's: a foreground run's "sandbox run" (its
 * launcher reports), a created init's "sandbox" (set before hide_command_line blanks argv) */
static const char *line_prefix = "sandbox";
static int report_waits; /* a created init's: its report goes to the builder, in its pid namespace */

/* One "err CODE MESSAGE" line to P (gofer/enter.py's report), then exit with CODE; a
 * created init past start has nobody to tell but the container's stderr (as gofer/main.py).
 * A created init waits for the builder to hang up first: pid 1's exit kills every process
 * of its pid namespace, the builder too, which would never pass the line on. */
static void fail(int code, const char *fmt, ...) {
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

static unsigned long long hex(const char *s) { return strtoull(s, NULL, 16); }

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
static void close_except(unsigned low, const int *keep, int nkeep) {
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
static int cloexec_from(unsigned low) {
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

static const char *next_item(const char **p, const char *end) {
    const char *item = *p;
    const char *nul = memchr(item, '\0', (size_t)(end - item));
    if (nul == NULL) return NULL;
    *p = nul + 1;
    return item;
}

const char *plan_records(const char *buf, size_t *n, int *fds, int *nfds) {
    if (*n != 6 || memcmp(buf, "memfd", 6) || *nfds < 1) return buf;
    struct stat st;
    char *file = NULL;
    int ok = fstat(fds[0], &st) == 0 && st.st_size > 0 && st.st_size <= MAX_PLAN_FILE
             && (file = malloc((size_t)st.st_size + 1)) != NULL && pread(fds[0], file, (size_t)st.st_size, 0) == st.st_size;
    close(fds[0]);
    memmove(fds, fds + 1, (size_t)(*nfds - 1) * sizeof *fds);
    (*nfds)--;
    if (!ok || (st.st_size == 6 && !memcmp(file, "memfd", 6))) { /* (one level: never a memfd in a memfd) */
        free(file);
        return NULL;
    }
    file[st.st_size] = '\0';
    *n = (size_t)st.st_size;
    return file; /* (the plan's strings: kept while the plan is) */
}

/* The plan's records; -1 on anything malformed (the launcher then says so: never a guess).
 * The tables are as big as the plan's records ask (execve has the last word on the size). */
static int parse(struct plan *pl, const char *buf, size_t n, int *fds, int nfds) {
    size_t count[5] = {0}; /* arg, env, group, rlimit, hook items; hooks */
    size_t hooks = 0;
    for (const char *p = buf, *end = buf + n, *item; p < end && (item = next_item(&p, end)) != NULL;) {
        count[0] += !strncmp(item, "arg ", 4), count[1] += !strncmp(item, "env ", 4);
        count[2] += !strncmp(item, "group ", 6), count[3] += !strncmp(item, "rlimit ", 7);
        count[4] += !strncmp(item, "hook-arg ", 9) || !strncmp(item, "hook-env ", 9), hooks += !strncmp(item, "hook ", 5);
    }
    memset(pl, 0, sizeof *pl);
    pl->argv = calloc(count[0] + 1, sizeof *pl->argv), pl->envp = calloc(count[1] + 1, sizeof *pl->envp);
    pl->groups = calloc(count[2] + 1, sizeof *pl->groups), pl->rlimits = calloc(count[3] + 1, sizeof *pl->rlimits);
    pl->hook_items = calloc(count[4] + 1, sizeof *pl->hook_items), pl->hooks = calloc(hooks + 1, sizeof *pl->hooks);
    if (!pl->argv || !pl->envp || !pl->groups || !pl->rlimits || !pl->hook_items || !pl->hooks) return -1;
    pl->cwd = -1, pl->fifo = -1, pl->console = -1, pl->listener = -1, pl->proc = -1, pl->code_process = 1, pl->code_exec = 127, pl->code_bundle = 2;
    const char *p = buf, *end = buf + n, *item;
    int fdi = 0;
#define TAKE_FD() (fdi < nfds ? fds[fdi++] : -1)
    while (p < end && (item = next_item(&p, end)) != NULL) {
        const char *v = strchr(item, ' ');
        v = v ? v + 1 : "";
        if (!strncmp(item, "plan", 4)) continue;
        else if (!strncmp(item, "clone", 5)) pl->clone = 1;
        else if (!strncmp(item, "unshare ", 8)) pl->unshare = atoi(v);
        else if (!strncmp(item, "oom ", 4)) pl->oom = strtol(v, NULL, 10), pl->oom_set = 1;
        else if (!strncmp(item, "detach ", 7)) pl->detach = atoi(v);
        else if (!strncmp(item, "preserve ", 9)) { /* 0 or more: a negative one would keep every fd */
            char *end;
            long k = strtol(v, &end, 10);
            if (end == v || *end != '\0' || k < 0 || k > 1 << 20) return -1;
            pl->preserve = (int)k;
        }
        else if (!strncmp(item, "nnp ", 4)) pl->nnp = atoi(v);
        else if (!strncmp(item, "lastcap ", 8)) pl->last_cap = atoi(v);
        else if (!strncmp(item, "umask ", 6)) pl->umask = atoi(v);
        else if (!strncmp(item, "codes ", 6)) sscanf(v, "%d %d %d", &pl->code_process, &pl->code_exec, &pl->code_bundle);
        else if (!strncmp(item, "caps ", 5)) {
            char b[5][20];
            if (sscanf(v, "%19s %19s %19s %19s %19s", b[0], b[1], b[2], b[3], b[4]) != 5) return -1;
            pl->bounding = hex(b[0]), pl->permitted = hex(b[1]), pl->inheritable = hex(b[2]);
            pl->effective = hex(b[3]), pl->ambient = hex(b[4]);
        } else if (!strncmp(item, "user ", 5)) {
            if (sscanf(v, "%u %u", &pl->uid, &pl->gid) != 2) return -1;
        } else if (!strncmp(item, "group ", 6)) {
            pl->groups[pl->ngroups++] = (gid_t)strtoul(v, NULL, 10);
        } else if (!strncmp(item, "rlimit ", 7)) {
            unsigned long long soft, hard;
            int res, off = 0;
            if (sscanf(v, "%d %llu %llu %n", &res, &soft, &hard, &off) != 3) return -1;
            pl->rlimits[pl->nrlimits].resource = res;
            pl->rlimits[pl->nrlimits].soft = soft == UINT64_MAX ? RLIM_INFINITY : (rlim_t)soft;
            pl->rlimits[pl->nrlimits].hard = hard == UINT64_MAX ? RLIM_INFINITY : (rlim_t)hard;
            pl->rlimits[pl->nrlimits++].text = v + off;
        } else if (!strncmp(item, "ns ", 3)) {
            if (pl->nns == PLAN_MAX_NS) return -1;
            const char *name = strchr(v, ' ');
            pl->ns[pl->nns].flag = atoi(v);
            pl->ns[pl->nns].name = name ? name + 1 : "?";
            if ((pl->ns[pl->nns++].fd = TAKE_FD()) < 0) return -1;
        } else if (!strncmp(item, "cgroup ", 7)) {
            if (pl->ncgroups == PLAN_MAX_CGROUPS) return -1;
            pl->cgroups[pl->ncgroups].path = v;
            if ((pl->cgroups[pl->ncgroups++].fd = TAKE_FD()) < 0) return -1;
        } else if (!strcmp(item, "fifo")) {
            if ((pl->fifo = TAKE_FD()) < 0) return -1;
        } else if (!strncmp(item, "apparmor ", 9)) {
            pl->apparmor = v;
        } else if (!strncmp(item, "selinux ", 8)) {
            pl->selinux = v;
        } else if (!strcmp(item, "proc")) {
            if ((pl->proc = TAKE_FD()) < 0) return -1;
        } else if (!strcmp(item, "console")) {
            if ((pl->console = TAKE_FD()) < 0) return -1;
        } else if (!strncmp(item, "console-size ", 13)) {
            if (sscanf(v, "%hu %hu", &pl->rows, &pl->cols) != 2) return -1;
        } else if (!strncmp(item, "cwd ", 4)) {
            pl->cwd_text = v;
            if ((pl->cwd = TAKE_FD()) < 0) return -1;
        } else if (!strncmp(item, "seccomp ", 8)) {
            pl->early_seccomp = !strcmp(v, "early");
            int fd = TAKE_FD();
            struct stat st;
            if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter)
                || st.st_size > BPF_MAXINSNS * (off_t)sizeof(struct sock_filter)) return -1;
            pl->bpf = malloc((size_t)st.st_size);
            if (pl->bpf == NULL || pread(fd, pl->bpf, (size_t)st.st_size, 0) != st.st_size) return -1;
            pl->bpf_len = (unsigned short)(st.st_size / sizeof(struct sock_filter)); /* (the fd: closed with the rest) */
        } else if (!strncmp(item, "seccomp-flags ", 14)) {
            if (sscanf(v, "%u", &pl->seccomp_flags) != 1 || pl->seccomp_flags & ~7U) return -1;
        } else if (!strncmp(item, "seccomp-listener ", 17)) {
            int off = 0;
            if (sscanf(v, "%d %n", &pl->listener_pid, &off) != 1 || off == 0 || pl->listener_pid < 0) return -1;
            pl->listener_rest = v + off;
            if ((pl->listener = TAKE_FD()) < 0) return -1;
        } else if (!strncmp(item, "sched ", 6)) {
            int off = 0;
            if (sscanf(v, "%u %llu %d %u %llu %llu %llu%n", &pl->sc.policy, &pl->sc.flags, &pl->sc.nice,
                       &pl->sc.priority, &pl->sc.runtime, &pl->sc.deadline, &pl->sc.period, &off) != 7 || v[off])
                return -1;
            pl->sched = 1;
        } else if (!strncmp(item, "ioprio ", 7)) {
            if (sscanf(v, "%d %d", &pl->ioprio_class, &pl->ioprio_level) != 2) return -1;
            pl->ioprio = 1;
        } else if (!strncmp(item, "personality ", 12)) {
            if (sscanf(v, "%lu", &pl->persona_value) != 1) return -1;
            pl->persona = 1;
        } else if (!strncmp(item, "root ", 5)) {
            if (sscanf(v, "%llu %llu", &pl->root_dev, &pl->root_ino) != 2) return -1;
            pl->root_set = 1;
        } else if (!strncmp(item, "uid-map ", 8)) {
            pl->uid_map = v;
        } else if (!strncmp(item, "gid-map ", 8)) {
            pl->gid_map = v;
        } else if (!strncmp(item, "start-state ", 12)) {
            pl->start_state = v;
        } else if (!strncmp(item, "hook ", 5)) { /* "hook TIMEOUT PATH", its args and env follow */
            int timeout, off = 0;
            if (sscanf(v, "%d %n", &timeout, &off) != 1 || off == 0 || timeout < 0
                || v[off] != '/')
                return -1;
            pl->hooks[pl->nhooks].path = v + off, pl->hooks[pl->nhooks].timeout = timeout;
            pl->hooks[pl->nhooks++].arg0 = pl->nhook_items;
        } else if (!strncmp(item, "hook-arg ", 9) || !strncmp(item, "hook-env ", 9)) {
            int env = item[5] == 'e';
            if (!pl->nhooks || (!env && pl->hooks[pl->nhooks - 1].nenv)) return -1;
            pl->hook_items[pl->nhook_items++] = (char *)v;
            if (env) pl->hooks[pl->nhooks - 1].nenv++;
            else pl->hooks[pl->nhooks - 1].nargs++;
        } else if (!strncmp(item, "arg ", 4)) {
            pl->argv[pl->argc++] = (char *)v;
        } else if (!strncmp(item, "env ", 4)) {
            pl->envp[pl->envc++] = (char *)v;
        } else {
            return -1; /* a record this launcher does not know: an older build than the server */
        }
    }
#undef TAKE_FD
    for (int i = 0; i < pl->nhooks; i++)
        if (pl->hooks[i].nargs == 0) return -1;
    if (pl->nhooks && pl->start_state == NULL) return -1;
    return p == end && (pl->argc > 0 || pl->clone) && fdi == nfds ? 0 : -1; /* (every record NUL-ended) */
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
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = msg, .iov_len = (size_t)n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    int notify = (int)fd;
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &notify, sizeof(int));
    ssize_t sent;
    do sent = sendmsg(pl->listener, &m, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    if (sent < 0) fail(1, "linux.seccomp.listenerPath: cannot send the notification fd: %s", strerror(errno));
    close(notify);
    close(pl->listener);
    pl->listener = -1;
    free(msg);
}

/* process.scheduler, process.ioPriority and linux.personality: gofer.process.set_scheduling's
 * calls and its lines, while we still hold CAP_SYS_NICE, in the process that execs (a task
 * under SCHED_DEADLINE cannot fork). */
static void set_scheduling(struct plan *pl) {
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

/* A created init, its user and capabilities set: "ready" to the gofer, which records the
 * container and answers with one byte (its EOF instead: it gave up, and so do we); then the
 * wait for `sandbox start`, whose byte comes through exec.fifo (open read-write: no EOF). */
static void wait_for_start(struct plan *pl) {
    char c;
    ssize_t r;
    if (dprintf(report_fd, "ready\n") < 0) _exit(1);
    do r = read(report_fd, &c, 1); while (r < 0 && errno == EINTR);
    if (r != 1) _exit(1);
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
    char name[] = "/dev/ptmx";
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = name, .iov_len = sizeof name - 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &master, sizeof(int));
    ssize_t sent;
    do sent = sendmsg(pl->console, &msg, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    if (sent < 0)
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
static void apply_labels(struct plan *pl) {
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
static void process(struct plan *pl) {
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
static int join_namespaces(struct plan *pl, char *err, size_t n) {
    for (int i = 0; i < pl->nns; i++) {
        if (setns(pl->ns[i].fd, pl->ns[i].flag) < 0) {
            snprintf(err, n, "setns the container's %s namespace: %s", pl->ns[i].name, strerror(errno));
            return -1;
        }
        close(pl->ns[i].fd);
    }
    return 0;
}

static void set_rlimits(struct plan *pl) {
    for (int i = 0; i < pl->nrlimits; i++) {
        struct rlimit rl = {.rlim_cur = pl->rlimits[i].soft, .rlim_max = pl->rlimits[i].hard};
        if (setrlimit(pl->rlimits[i].resource, &rl) < 0)
            fail(pl->code_bundle, "process.rlimits%s: %s", pl->rlimits[i].text, strerror(errno));
    }
}

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

ssize_t recv_plan(int s, char *buf, size_t cap, int *fds, int *nfds, int flags) {
    union { char buf[CMSG_SPACE(MAX_FDS * sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t r;
    *nfds = 0;
    do r = recvmsg(s, &msg, MSG_CMSG_CLOEXEC | flags); while (r < 0 && errno == EINTR);
    for (struct cmsghdr *c = r > 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k && *nfds < MAX_FDS; i++) memcpy(&fds[(*nfds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    if (r > 0 && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < *nfds; i++) close(fds[i]);
        *nfds = 0;
        errno = EMSGSIZE;
        return -1;
    }
    if (r >= 0) buf[r] = '\0';
    return r;
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
 * for its end. We pass signals on, reap it, send "status N" (the wait status), and exit with
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
    int n = snprintf(line, sizeof line, "status %d", status);
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
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = report, .iov_len = strlen(report)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (init > 0) {
        close(chan[1]);
        msg.msg_control = control.buf, msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &chan[0], sizeof(int));
    }
    /* a run's signals go to the container from now on, as Python's run passes them on (its
     * poststart hooks run after it has exec'd; before, an init without a handler ignores them) */
    if (init > 0 && strcmp(verb, "run") == 0) forward_signals(init);
    ssize_t sent = sendmsg(s, &msg, 0);
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
