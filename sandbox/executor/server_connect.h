/* Reaching the warm server (sandbox/server/listen.py), for the launcher (launcher.c), whose
 * verbs and hooks it serves: one connect, and where nothing answers at the socket, a
 * server started here, detached, with this very connection queued as its first request
 * (issue #33: no one pays the interpreter's start twice, units installed or not).
 *
 * A server is started only by a caller that is the node's root: uid 0, every capability of
 * its bounding set effective and that set at least pid 1's, no seccomp filter, no
 * no_new_privs, the node's namespaces (user, pid, uts, ipc, cgroup and time, and those its
 * children would get, by the kernel's fixed inodes of the initial ones; mount and net as
 * pid 1's, or kthreadd's where pid 1's cannot be read), pid 1's root, and only below
 * directories that are root's and writable by no one else (the socket's directory is made
 * 0700 where missing), and only where the server would be pid 1's child once detached (not
 * a subreaper's: conmon would wait for it). Anything else connects or falls back as before,
 * with no server started. A lock on the socket's directory makes one starter of many; the
 * loser connects to the winner's server.
 *
 * The server (`sandbox serve --idle-exit N`, N from $SANDBOX_SERVER_IDLE: default 600 s,
 * 0: never start one) gets the bound socket as systemd would pass it (fd 3, LISTEN_FDS=1),
 * /dev/null on stdin, SOCKET.log on stdout and stderr (appended to), "/" as its cwd,
 * PATH alone as its environment, a session of its own, no other fd of ours, default signals,
 * and a service's place on the node (node_place); it leaves once idle N seconds, its socket
 * removed first.
 */
#ifndef SANDBOX_SERVER_CONNECT_H
#define SANDBOX_SERVER_CONNECT_H
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define IDLE_DEFAULT "600"
#define SERVER_PATH_ENV "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* A connection to the server at path whose peer is root's, or -1 with errno (ENOENT or
 * ECONNREFUSED: nobody listens there). Sends time out after 1 s (a full listen queue). */
static int connect_root(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (*path == '\0' || strlen(path) >= sizeof addr.sun_path) return errno = EINVAL, -1;
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct timeval limit = {.tv_sec = 1};
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (s < 0) return -1;
    if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) < 0
        || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int e = errno;
        close(s);
        return errno = e, -1;
    }
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != 0) {
        close(s);
        return errno = EPERM, -1;
    }
    return s;
}

/* The hexadecimal value of "Key:" in /proc/<pid>/status, or -1. */
static long long status_field(const char *pid, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "re");
    long long v = -1;
    size_t n = strlen(key);
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtoll(line + n + 1, NULL, 16);
            break;
        }
    fclose(f);
    return v;
}

static int same_ns(const char *name, const char *other) {
    char path[64];
    struct stat a, b;
    snprintf(path, sizeof path, "/proc/%s/ns/%s", other, name);
    if (stat(path, &b) < 0) return -1;
    snprintf(path, sizeof path, "/proc/self/ns/%s", name);
    return stat(path, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Whether this process is the node's root (see the top of this file). */
static int node_root(void) {
    static const struct { const char *name; ino_t ino; } initial[] = {
        {"user", 0xEFFFFFFD}, {"pid", 0xEFFFFFFC}, {"uts", 0xEFFFFFFE}, {"ipc", 0xEFFFFFFF},
        {"cgroup", 0xEFFFFFFB}, {"time", 0xEFFFFFFA}}; /* include/linux/proc_ns.h */
    char path[64];
    struct stat st;
    struct rlimit files;
    if (getuid() != 0 || geteuid() != 0) return 0;
    long long eff = status_field("self", "CapEff"), bnd = status_field("self", "CapBnd");
    long long bnd1 = status_field("1", "CapBnd");
    if (eff < 0 || eff != bnd || bnd1 < 0 || (bnd & bnd1) != bnd1 || status_field("self", "Seccomp") != 0
        || status_field("self", "NoNewPrivs") != 0)
        return 0;
    if (getrlimit(RLIMIT_NOFILE, &files) < 0 || files.rlim_max < 1024) return 0;
    for (size_t i = 0; i < sizeof initial / sizeof *initial; i++) {
        snprintf(path, sizeof path, "/proc/self/ns/%s", initial[i].name);
        if (stat(path, &st) < 0) {
            if (errno == ENOENT) continue; /* (a kernel without that namespace) */
            return 0;
        }
        if (st.st_ino != initial[i].ino) return 0;
    }
    for (size_t i = 0; i < 2; i++) { /* where our children would go (an unshare -p without a fork: a
                                       * new one, unreadable until its first process) */
        snprintf(path, sizeof path, "/proc/self/ns/%s_for_children", i ? "time" : "pid");
        if (lstat(path, &st) < 0 && errno == ENOENT) continue; /* (a kernel without it) */
        if (stat(path, &st) < 0 || st.st_ino != (i ? 0xEFFFFFFA : 0xEFFFFFFC)) return 0;
    }
    const char *init = "1";
    int same = same_ns("mnt", init);
    if (same < 0) same = same_ns("mnt", init = "2"); /* (pid 1's unreadable: kthreadd's, in the initial pid ns) */
    if (same != 1 || same_ns("net", init) != 1) return 0;
    struct stat ours, theirs; /* and its root: not a chroot */
    snprintf(path, sizeof path, "/proc/%s/root", init);
    return stat("/", &ours) == 0 && stat(path, &theirs) == 0 && ours.st_dev == theirs.st_dev
           && ours.st_ino == theirs.st_ino;
}

/* The directory dir (absolute), opened, where it and every directory on the way from / is
 * root's, no link, and writable by neither group nor others (but a sticky one on the way,
 * as /tmp; mounts/trusted.py's rule); made 0700 where it is the last one and missing. -1
 * otherwise. */
static int root_only_dir(const char *dir) {
    if (dir[0] != '/') return -1;
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (const char *p = dir;;) {
        struct stat st;
        char name[NAME_MAX + 1];
        while (*p == '/') p++;
        int last = *p == '\0';
        if (fd < 0 || fstat(fd, &st) < 0 || st.st_uid != 0
            || (st.st_mode & 022 && (last || !(st.st_mode & S_ISVTX)))) {
            if (fd >= 0) close(fd);
            return -1;
        }
        if (last) {
            int rd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            close(fd);
            return rd;
        }
        size_t n = strcspn(p, "/");
        if (n > NAME_MAX || (n == 2 && p[0] == '.' && p[1] == '.')) n = 0;
        memcpy(name, p, n);
        name[n] = '\0';
        p += n;
        int final = p[strspn(p, "/")] == '\0';
        int next = n ? openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        if (next < 0 && n && errno == ENOENT && final) { /* (or made meanwhile by another starter) */
            mkdirat(fd, name, 0700);
            next = openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        close(fd);
        fd = next;
    }
}

/* The node's place for the server, as a service's, instead of its starter's (an engine's
 * unit, a pod's shim: stopped or limited, it must not take the node's server along, nor
 * pass on what it set for itself): the root cgroup of each hierarchy, pid 1's resource
 * limits but a service's open files (1024, hard up to 524288), OOM score 0, SCHED_OTHER at
 * nice 0, no I/O class, the plain Linux personality, pid 1's CPUs, a session keyring of its
 * own. Each as far as the kernel lets it. */
static void node_place(void) {
    char line[4096], me[32], root[1024], point[1024], procs[1100];
    snprintf(me, sizeof me, "%d", (int)getpid());
    FILE *f = fopen("/proc/self/mountinfo", "re");
    while (f && fgets(line, sizeof line, f)) {
        const char *dash = strstr(line, " - ");
        if (!dash || (strncmp(dash + 3, "cgroup ", 7) && strncmp(dash + 3, "cgroup2 ", 8))) continue;
        if (sscanf(line, "%*d %*d %*s %1023s %1023s", root, point) != 2 || strcmp(root, "/")) continue;
        snprintf(procs, sizeof procs, "%s/cgroup.procs", point);
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd >= 0 && write(fd, me, strlen(me)) < 0) {} /* (best effort) */
        if (fd >= 0) close(fd);
    }
    if (f) fclose(f);
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        struct rlimit rl;
        if (prlimit(1, (enum __rlimit_resource)r, NULL, &rl) < 0) continue;
        if (r == RLIMIT_NOFILE) {
            if (rl.rlim_max > 524288) rl.rlim_max = 524288;
            rl.rlim_cur = rl.rlim_max < 1024 ? rl.rlim_max : 1024;
        }
        setrlimit((enum __rlimit_resource)r, &rl);
    }
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && write(fd, "0", 1) < 0) {}
    if (fd >= 0) close(fd);
    struct sched_param sp = {0};
    sched_setscheduler(0, SCHED_OTHER, &sp);
    setpriority(PRIO_PROCESS, 0, 0);
    syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, 0 /* IOPRIO_CLASS_NONE */);
    personality(PER_LINUX);
    cpu_set_t cpus;
    if (sched_getaffinity(1, sizeof cpus, &cpus) == 0) sched_setaffinity(0, sizeof cpus, &cpus);
    syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL);
}

/* In the server's process, never returns: its place, fds, cwd, environment and signals,
 * then argv. */
static void exec_server(int listener, int dirfd, const char *base, char *const *argv) {
    char log[NAME_MAX + 1], pid[32];
    node_place();
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    snprintf(log, sizeof log, "%s.log", base);
    int out = openat(dirfd, log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st = {0};
    if (out >= 0) fstat(out, &st); /* (the server empties it past its LOG_CAP) */
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    /* above 3, each: none may be 0-2 (a caller with those closed) or 3 when a dup2 comes */
    out = out >= 0 ? fcntl(out, F_DUPFD_CLOEXEC, 4) : -1;
    null = null >= 0 ? fcntl(null, F_DUPFD_CLOEXEC, 4) : -1;
    listener = fcntl(listener, F_DUPFD_CLOEXEC, 4);
    if (out < 0 || null < 0 || listener < 0 || !S_ISREG(st.st_mode) || dup2(null, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0
        || dup2(listener, 3) < 0 || syscall(SYS_close_range, 4, ~0U, 0) < 0
        || chdir("/") < 0)
        _exit(127);
    umask(022);
    snprintf(pid, sizeof pid, "LISTEN_PID=%d", (int)getpid());
    char *env[] = {SERVER_PATH_ENV, "LISTEN_FDS=1", pid, NULL};
    execve(argv[0], argv, env);
    dprintf(2, "sandbox: cannot start the server %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* A connection to a server started here at path (argv: its command line, `serve --idle-exit
 * N` last), queued before it runs; or, where another starter won, to that one. -1 where none
 * could be started. */
static int start_server(const char *path, char *const *argv) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (path[0] != '/' || !slash || slash == path || (size_t)(slash - path) >= sizeof dir || !slash[1]) return -1;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    int dirfd = root_only_dir(dir);
    if (dirfd < 0) return -1;
    int s = -1, l = -1;
    if (flock(dirfd, LOCK_EX) < 0) goto out;
    s = connect_root(path); /* (started meanwhile by another) */
    if (s >= 0 || (errno != ENOENT && errno != ECONNREFUSED)) goto out;
    struct stat st;
    if (fstatat(dirfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) == 0
        && (!S_ISSOCK(st.st_mode) || unlinkat(dirfd, slash + 1, 0) < 0)) /* (a dead server's socket) */
        goto out;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, path);
    l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    mode_t mask = umask(077);
    int bound = l >= 0 && bind(l, (struct sockaddr *)&addr, sizeof addr) == 0;
    umask(mask);
    if (!bound || listen(l, 64) < 0) goto out;
    s = connect_root(path); /* queued: the server's first request */
    if (s < 0) {
        unlinkat(dirfd, slash + 1, 0);
        goto out;
    }
    /* detached: its parent exits, and the server's is pid 1 then; or a subreaper's on the way
     * (conmon, a shim, a session manager), which would wait for it (conmon does, past its
     * container's end): then none is started (the word back on a pipe) */
    int word[2] = {-1, -1};
    char adopted = 0;
    pid_t child = pipe2(word, O_CLOEXEC) == 0 ? fork() : -1;
    if (child < 0 && word[0] >= 0) close(word[0]), close(word[1]);
    if (child == 0) {
        setsid();
        pid_t parent = getpid();
        if (fork() == 0) {
            for (int i = 0; getppid() == parent && i < 20000; i++) usleep(50);
            adopted = getppid() == 1 ? 'y' : 'n';
            if (write(word[1], &adopted, 1) == 1 && adopted == 'y') exec_server(l, dirfd, slash + 1, argv);
        }
        _exit(0);
    }
    if (child > 0) {
        close(word[1]);
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
        while (read(word[0], &adopted, 1) < 0 && errno == EINTR) {}
        close(word[0]);
    }
    if (adopted != 'y') {
        if (s >= 0) close(s);
        s = -1;
        unlinkat(dirfd, slash + 1, 0);
    }
out:
    if (l >= 0) close(l);
    close(dirfd); /* (the lock goes with it) */
    return s;
}

/* The server's idle seconds for `serve --idle-exit`, from $SANDBOX_SERVER_IDLE (digits), or
 * NULL: none is to be started (0, or not a number of seconds). */
static const char *server_idle(void) {
    const char *idle = getenv("SANDBOX_SERVER_IDLE");
    if (idle == NULL) return IDLE_DEFAULT;
    size_t n = strspn(idle, "0123456789");
    if (n == 0 || n > 7 || idle[n] || strspn(idle, "0") == n) return NULL;
    return idle;
}

/* A connection to the root server at path, started first where nothing answers there and the
 * caller may start one (serve: its command line, up to the verb; "serve --idle-exit N" is
 * added). -1 where there is none to use. */
static int server_connect(const char *path, char *const *serve, int n) {
    int s = connect_root(path);
    if (s >= 0 || (errno != ENOENT && errno != ECONNREFUSED)) return s;
    const char *idle = server_idle();
    if (idle == NULL || n > 16 || !node_root()) return -1;
    char *argv[24];
    for (int i = 0; i < n; i++) argv[i] = serve[i];
    argv[n] = "serve", argv[n + 1] = "--idle-exit", argv[n + 2] = (char *)idle, argv[n + 3] = NULL;
    return start_server(path, argv);
}

#endif
