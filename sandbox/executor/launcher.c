/*
 * The `sandbox` executable: starts our Python (isolated, no site, the installation's import
 * paths baked in) from a read-only view of the interpreter (CVE-2019-5736).
 *
 * Processes of ours that a container can see before they exec (a created init, the child of
 * `sandbox exec`, a server's builder in a container's pid namespace) must not be host files
 * the container could write: a container process holding CAP_SYS_PTRACE reads past their
 * non-dumpable flag, keeps /proc/<pid>/exe open and rewrites the file once it is no longer
 * busy. So exec, create and run re-execute this program, and a server (`serve`) runs the
 * interpreter, from a detached read-only bind mount of the file (open_tree + mount_setattr,
 * attached nowhere): /proc/<pid>/exe then leads to a mount the kernel refuses to write
 * through (EROFS), with no copy (runc 1.2 seals itself the same way, with an overlay). Where
 * the kernel refuses that (not root, a kernel before 5.12), from a copy in a sealed memfd
 * (runc 1.1's way). Other verbs run the interpreter from the read-only view where they can.
 *
 * A verb that starts no process of the container's (state, kill, delete, start, ...: the
 * warm server's SERVED), and an OCI hook's call (`hook`, `cdi hook`: `hook install` and `cdi
 * generate` write this program into hook entries, so a hook served warm starts no Python),
 * is first offered to the warm server (sandbox/server/listen.py, at a hook's --server,
 * $SANDBOX_SERVER or /run/gpu-sandbox/hook.sock; SANDBOX_SERVER= never; where none listens
 * and the caller is the node's root, one is started, sandbox/executor/server_connect.h): the request carries
 * the command line, the cwd, the umask and the environment (a byte that is not UTF-8 as
 * Python's surrogateescape reads it), and this process's stdin, stdout and stderr as
 * SCM_RIGHTS (a closed one is /dev/null first, as under runc), so the server's forked child
 * writes where the verb would, and the exit code comes back. No Python starts here. Where the
 * server is of no use (none listens, it is not root's, it declines, a full queue for a
 * second, no answer in TAKE_UP_S) the verb runs in our Python; once it has taken the verb up
 * ({"running"}, exec's plan), its death is one line and exit 1, never a second run (the
 * request, the engine's environment, is blanked before it is freed: the heap is what a
 * served create's pid 1 starts with).
 *
 * `exec`, `create` and `run` are never run in Python: the server answers with a plan that
 * frontend.c carries out in this process tree (sandbox/executor/exec_plan.py,
 * sandbox/executor/create_plan.py); where the server is of no use (or SANDBOX_SERVER= is empty),
 * a planner of our own does (own_planner: `serve --once` on a socketpair, the same wire and
 * code), and where it declines too (not the node's root), the verb fails with its reason.
 *
 * sandbox/executor/build.py builds this file with SANDBOX_PYTHON (the interpreter, as argv[0]
 * names it), SANDBOX_CODE (the program for -c), SANDBOX_SERVED and SANDBOX_GLOBAL_VALUES
 * (the served verbs and the global options that take a value, from Python's own lists)
 * defined in a generated header.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include SANDBOX_CONFIG

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif
#include "frontend.h"
#include "server_connect.h"

extern char **environ;

static const char *const served_verbs[] = {SANDBOX_SERVED, NULL};
static const char *const global_values[] = {SANDBOX_GLOBAL_VALUES, NULL};

static int listed(const char *const *list, const char *s) {
    for (; *list; list++)
        if (strcmp(*list, s) == 0) return 1;
    return 0;
}

/* Where the verb is, past the global options (cli.verb_of), or 0. */
static int verb_at(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') return i;
        if (listed(global_values, argv[i])) i++;
    }
    return 0;
}

/* v[0..n) as JSON strings; with vars, only NAME=VALUE entries (Python's environ has no others) */
static int json_strings(struct buf *b, char **v, int n, int vars) {
    for (int i = 0, first = 1; i < n; i++) {
        if (vars && (v[i][0] == '=' || !strchr(v[i], '=')))
            continue;
        if ((!first && put(b, ", ", 2)) || json_string(b, v[i], strlen(v[i])))
            return -1;
        first = 0;
    }
    return 0;
}

static const char *socket_path; /* the server's: $SANDBOX_SERVER or DEFAULT_SOCKET; a hook's --server */

static const char *server_path(void) {
    if (socket_path == NULL) socket_path = getenv("SANDBOX_SERVER") ? getenv("SANDBOX_SERVER") : DEFAULT_SOCKET;
    return socket_path;
}

/* Whether argv[at] is an OCI hook's call (`hook ...` as `hook install` writes it, or our CDI
 * spec's `cdi hook ...`), which the server runs as a verb, the container's state on the
 * stdin passed to it. Not `hook install` or `hook serve`, nor a hook that writes its own
 * trace (--trace: the server declines it). A hook's --server names the socket, unless
 * SANDBOX_SERVER= (empty) says none. */
static int hook_call(int argc, char **argv, int at) {
    int cdi = !strcmp(argv[at], "cdi") && at + 1 < argc && !strcmp(argv[at + 1], "hook");
    const char *env = getenv("SANDBOX_SERVER");
    if (strcmp(argv[at], "hook") && !cdi) return 0;
    for (int i = at + 1; i < argc; i++) {
        if (!cdi && (!strcmp(argv[i], "install") || !strcmp(argv[i], "serve"))) return 0;
        if (!strncmp(argv[i], "--trace", 7) && (argv[i][7] == '\0' || argv[i][7] == '=')) return 0;
        if (!strcmp(argv[i], "--server") && i + 1 < argc && !(env && !*env)) socket_path = argv[i + 1];
    }
    return 1;
}

/* An older installation's hook entry, run through the `sandbox-hook` link to this program
 * (its C client's name, which CDI specs and bundles written then still name): "sandbox-hook
 * PYTHON -I -S -c CODE hook ..." or "... cdi hook ...". Its argv, from the verb on, in place
 * of ours (argv[0] kept); where it is not such an entry, argv as it is. */
static char **older_entry(int *argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    if (strcmp(name ? name + 1 : argv[0], "sandbox-hook")) return argv;
    for (int i = 1; i + 2 < *argc; i++)
        if (!strcmp(argv[i], "-c") && (!strcmp(argv[i + 2], "hook") || !strcmp(argv[i + 2], "cdi"))) {
            argv[i + 1] = argv[0];
            *argc -= i + 1;
            return argv + i + 1;
        }
    return argv;
}

/* No server to plan exec, create or run: a planner of our own, this program's `serve --once`
 * with the other end of a socketpair as its fd 3 (the same wire and code as a server's
 * child, for one request), /dev/null as its stdio, PATH alone as its environment, no other
 * fd of ours, and not our child (its parent exits at once: nothing here waits for it). */
static int own_planner(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (fork() != 0) _exit(0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        null = null >= 0 ? fcntl(null, F_DUPFD_CLOEXEC, 4) : -1; /* (above 3: a closed stdio's number, or 3) */
        int s = fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
        char *args[] = {"/proc/self/exe", "serve", "--once", NULL}, *env[] = {SERVER_PATH_ENV, NULL};
        if (null >= 0 && s >= 0 && dup2(null, 0) == 0 && dup2(null, 1) == 1 && dup2(null, 2) == 2 && dup2(s, 3) == 3
            && syscall(SYS_close_range, 4, ~0U, 0) == 0)
            execve(args[0], args, env);
        _exit(127);
    }
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return -1;
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    return sv[0];
}

/* The request (command line, cwd, umask, environment; stdio as SCM_RIGHTS) sent on s, a
 * connection to the warm server or to a planner of our own: s, or -1 (s closed) where it
 * could not be sent. */
static int send_request(int s, int argc, char **argv) {
    char cwd[PATH_MAX], mask[16];
    if (s < 0 || getcwd(cwd, sizeof cwd) == NULL) {
        if (s >= 0) close(s);
        return -1;
    }
    mode_t old = umask(0);
    umask(old);
    snprintf(mask, sizeof mask, "%u", (unsigned)old);
    int n = 0;
    while (environ[n]) n++;
    struct buf req = {.max = PLAN_MAX_FILE};
    if (put(&req, "{\"verb\": [", 10) || json_strings(&req, argv + 1, argc - 1, 0) || put(&req, "], \"cwd\": ", 10)
        || json_string(&req, cwd, strlen(cwd))
        || put(&req, ", \"umask\": ", 11) || put(&req, mask, strlen(mask)) || put(&req, ", \"env\": [", 10)
        || json_strings(&req, environ, n, 1) || put(&req, "], \"program\": ", 14)
        || json_string(&req, SANDBOX_CODE, strlen(SANDBOX_CODE)) || put(&req, "}", 1)) {
        buf_free(&req);
        close(s);
        errno = E2BIG;
        return -1;
    }
    /* one message, or (bigger than that, or refused as too big for the socket's buffer) a
     * sealed memfd ("memfd", its fd first: as a plan; the server takes only a sealed one) */
    int fds[4] = {-1, 0, 1, 2};
    ssize_t sent = req.n <= PLAN_MAX_MESSAGE ? send_fds(s, req.p, req.n, fds + 1, 3, 0) : -1;
    if (sent < 0 && (req.n > PLAN_MAX_MESSAGE || errno == EMSGSIZE)) {
        fds[0] = memfd_create("request", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fds[0] >= 0 && write(fds[0], req.p, req.n) == (ssize_t)req.n
            && fcntl(fds[0], F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) == 0)
            sent = send_fds(s, PLAN_MEMFD, sizeof PLAN_MEMFD, fds, 4, 0) == sizeof PLAN_MEMFD ? (ssize_t)req.n : -1;
        if (fds[0] >= 0) close(fds[0]);
    }
    if (sent != (ssize_t)req.n) {
        close(s);
        buf_free(&req);
        return -1;
    }
    buf_free(&req); /* (the engine's environment: blanked, not left in the heap pid 1 starts with) */
    return s;
}

/* A connection to the node's warm server (one started where none listens and we are the
 * node's root, server_connect.h), or -1. */
static int server(void) {
    char *self[] = {"/proc/self/exe"}; /* (a server started here is this program's `serve`) */
    return *server_path() ? server_connect(server_path(), self, 1) : -1;
}

static void set_deadline(int s, int seconds) {
    struct timeval limit = {.tv_sec = seconds};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
}

/* The server's first answer to the request ({"running"}: the verb taken up; {"fallback"};
 * exec's plan; an error's {"code"}) into buf (cap bytes and a NUL), with its fds: its length,
 * or -1 where none came (EOF or a reset: a server that stopped or declined us unread; nothing
 * within TAKE_UP_S). At the deadline shutdown(SHUT_RD) settles a race with a server that
 * answers just then: from it on, the server's sends fail (its child then gives up before the
 * verb has any effect), and what it sent before is still there to read, with *late set: no
 * more can come, so nothing taken up can then be waited for. */
static ssize_t first_answer(int s, char *buf, size_t cap, int *fds, int *nfds, int *late, int seconds) {
    *late = 0;
    set_deadline(s, seconds);
    ssize_t r = recv_plan(s, buf, cap, fds, nfds, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        shutdown(s, SHUT_RD);
        *late = 1;
        r = recv_plan(s, buf, cap, fds, nfds, MSG_DONTWAIT);
    }
    set_deadline(s, 0); /* (what follows the take-up may take as long as the verb does) */
    return r > 0 ? r : -1;
}

/* The verb run by the warm server's child: its exit code, or -1 where the server is of no use
 * (nothing has happened: the verb runs here). */
static int served(int argc, char **argv) {
    int s = send_request(server(), argc, argv);
    if (s < 0) return -1;
    char reply[4096];
    int fds[MAX_FDS], nfds = 0, late;
    ssize_t r = first_answer(s, reply, sizeof reply - 1, fds, &nfds, &late, TAKE_UP_S);
    for (int i = 0; i < nfds; i++) close(fds[i]); /* (none is sent with a verb's answer) */
    if (r < 0 || field(reply, "fallback")) { /* never taken up: here */
        close(s);
        return -1;
    }
    if (field(reply, "running") && late) {
        close(s);
        fprintf(stderr, "sandbox: the server at %s took the verb up only after %d s: its outcome is unknown\n",
                server_path(), TAKE_UP_S);
        return 1;
    }
    if (field(reply, "running")) { /* then {"code"}, once the verb is done: no deadline */
        do r = recv(s, reply, sizeof reply - 1, 0); while (r < 0 && errno == EINTR);
        if (r <= 0) {
            close(s);
            fprintf(stderr, "sandbox: the server at %s died before it answered\n", server_path());
            return 1;
        }
        reply[r] = '\0';
    }
    close(s);
    const char *code = field(reply, "code");
    char *end = NULL;
    long v = code ? strtol(code, &end, 10) : 0;
    if (!code || end == code) {
        fprintf(stderr, "sandbox: the server at %s gave no exit code\n", server_path());
        return 1;
    }
    return (int)(v & 0xff);
}

/* exec, create or run, planned by the warm server (own = 0) or by a planner of our own
 * (own = 1), and carried out here (frontend.c): its exit code, or -1 where the server is of
 * no use (nothing has happened yet: our own planner is asked next; our own planner's -1 is
 * said here). create and run are taken up ({"running"}) before the planner's child claims
 * the id: from then on the verb is never planned again, and the planner's death is an
 * error (issue #29); exec's plan is its taking up (nothing happens before it is carried out
 * here). Our own planner has no deadline: it is ours, and its death is the EOF we read. */
static int served_plan(int argc, char **argv, int at, int own) {
    const char *verb = argv[at];
    int s = send_request(own ? own_planner() : server(), argc, argv);
    if (s < 0 && own) {
        fprintf(stderr, "sandbox %s: cannot ask its planner: %s\n", verb, strerror(errno));
        return 1;
    }
    if (s < 0) return -1;
    char *buf = malloc(MAX_REQUEST + 1);
    int fds[MAX_FDS], nfds = 0, late = 0;
    ssize_t r = buf != NULL ? first_answer(s, buf, MAX_REQUEST, fds, &nfds, &late, own ? 0 : TAKE_UP_S) : -1;
    if (r > 0 && late && !field(buf, "code")) {
        /* too late to be waited for: a plan is not carried out (the server's child sees our EOF
         * before any report: nothing happened, our own planner plans it); a create taken up
         * fails at the server's next send and removes what it made */
        for (int i = 0; i < nfds; i++) close(fds[i]);
        if (field(buf, "running")) {
            fprintf(stderr, "sandbox %s: the server took it up only after %d s: not run\n", verb, TAKE_UP_S);
            close(s);
            free(buf);
            return 1;
        }
        r = -1;
    }
    if (r < 0 || (r > 0 && field(buf, "fallback"))) { /* never taken up */
        const char *why = r > 0 ? field(buf, "fallback") : NULL;
        if (own && why) /* ({"fallback": "WHY"}: WHY, its quotes and brace off) */
            fprintf(stderr, "sandbox %s: its planner declined: %.*s\n", verb, (int)(strlen(why) > 3 ? strlen(why) - 3 : 0),
                    why + 1);
        else if (own && r < 0) fprintf(stderr, "sandbox %s: its planner exited before it answered\n", verb);
        for (int i = 0; r > 0 && i < nfds; i++) close(fds[i]);
        close(s);
        free(buf);
        return own ? 1 : -1;
    }
    if (strncmp(buf, "plan", 4) && strncmp(buf, "clone", 5) && field(buf, "running")) {
        r = recv_plan(s, buf, MAX_REQUEST, fds, &nfds, 0); /* no deadline: the id, cgroups (systemd's) first */
        if (r <= 0) {
            fprintf(stderr, "sandbox %s: the server died before it answered\n", verb);
            close(s);
            free(buf);
            return 1;
        }
    }
    size_t n = (size_t)r;
    const char *records = plan_records(buf, &n, fds, &nfds); /* (a big plan comes in a memfd) */
    if (records == NULL) {
        fprintf(stderr, "sandbox %s: the server's plan is not one this launcher reads (rebuild both)\n", verb);
        for (int i = 0; i < nfds; i++) close(fds[i]);
        close(s);
        return 1;
    }
    if (strncmp(records, "plan", 4) == 0) return frontend_exec(s, records, n, fds, nfds, argv);
    if (strncmp(records, "clone", 5) == 0) return frontend_create(s, records, n, fds, nfds, argv, at);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    close(s); /* {"code"}: the error already printed; a {"fallback"} after {"running"}: none */
    int code = field(buf, "code") ? atoi(field(buf, "code")) & 0xff : 1;
    free(buf);
    return code;
}

#define SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)

/* Whether this very program runs from a file no one can write: a read-only mount (a sealed
 * view of itself), or a memfd sealed against writes (seal's copy). */
static int sealed(void) {
    struct statvfs st;
    if (statvfs("/proc/self/exe", &st) == 0 && (st.f_flag & ST_RDONLY)) return 1;
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
    if (fd >= 0) close(fd);
    return seals >= 0 && (seals & SEALS) == SEALS;
}

/* path as a file no one can write, to execute: a detached read-only bind mount of it
 * (open_tree + mount_setattr, attached nowhere), or where the kernel refuses that (no
 * CAP_SYS_ADMIN, a kernel before 5.12) and name is given, a copy in a sealed memfd of that
 * name (runc 1.1's way). The fd, or -1. */
static int sealed_file(const char *path, const char *name) {
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    if (fd >= 0 && syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0) return fd;
    if (fd >= 0) close(fd);
    if (name == NULL) return -1;
    int in = open(path, O_RDONLY | O_CLOEXEC);
    int mem = in >= 0 ? memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC) : -1;
    if (mem < 0 && in >= 0 && errno == EINVAL) /* (before 6.3, which has no MFD_EXEC: executable anyway) */
        mem = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    struct stat st;
    int ok = mem >= 0 && fstat(in, &st) == 0;
    for (off_t left = ok ? st.st_size : 0; ok && left > 0;) {
        ssize_t n = sendfile(mem, in, NULL, (size_t)left);
        if (n <= 0) ok = 0;
        else left -= n;
    }
    if (in >= 0) close(in);
    if (ok && fcntl(mem, F_ADD_SEALS, SEALS) == 0) return mem;
    if (mem >= 0) close(mem);
    return -1;
}

/* This program again, from a sealed view of itself: the exec front end joins the container
 * before it execs, and must not be a host file the container could write. Returns only
 * where that fails. */
static void seal(char **argv) {
    int fd = sealed_file("/proc/self/exe", "sandbox");
    if (fd >= 0) {
        syscall(SYS_execveat, fd, "", argv, environ, AT_EMPTY_PATH);
        int e = errno;
        close(fd);
        errno = e;
    }
}

/* Whether the verb is the server's (`serve`, `hook serve`): its children build containers'
 * roots in their namespaces, from our interpreter. */
static int serves(int argc, char **argv, int at) {
    return at && (!strcmp(argv[at], "serve") || (!strcmp(argv[at], "hook") && at + 1 < argc && !strcmp(argv[at + 1], "serve")));
}

/* stdin, stdout and stderr open: a closed one is /dev/null, as runc's gives the container
 * (Go's exec does), and no file we open takes its number. */
static int open_stdio(void) {
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd)
            return -1; /* (none to open: a socket of ours could take the number, and reach the container) */
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGCHLD, SIG_DFL); /* (a caller's SIG_IGN would have waitpid fail: Python's too) */
    if (open_stdio() < 0) {
        fprintf(stderr, "sandbox: a closed stdin, stdout or stderr, and no /dev/null to open in its place\n");
        return 1;
    }
    argv = older_entry(&argc, argv);
    int at = verb_at(argc, argv);
    const char *verb = at ? argv[at] : NULL;
    if (verb && (listed(served_verbs, verb) || hook_call(argc, argv, at))) {
        int code = served(argc, argv);
        if (code >= 0)
            return code;
    }
    if (verb && (!strcmp(verb, "exec") || !strcmp(verb, "create") || !strcmp(verb, "run"))) {
        errno = 0;
        if (!sealed())
            seal(argv);
        int e = errno;
        if (!sealed()) {
            errno = e ? e : EPERM;
            fprintf(stderr, "sandbox %s: cannot run from a sealed copy of itself: %s\n", verb, strerror(errno));
            return 1;
        }
        int code = served_plan(argc, argv, at, 0);
        return code >= 0 ? code : served_plan(argc, argv, at, 1);
    }
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (args == NULL)
        return 1;
    args[0] = SANDBOX_PYTHON;
    args[1] = "-IS";
    args[2] = "-Xutf8"; /* (paths and the request's \udcXX as bytes, whatever the locale) */
    args[3] = "-c";
    args[4] = SANDBOX_CODE;
    for (int i = 1; i < argc; i++)
        args[i + 4] = argv[i];
    /* the interpreter from a read-only view of itself; a server's (whose children enter
     * containers) from a sealed copy where the kernel refuses that view */
    int fd = sealed_file(SANDBOX_PYTHON, serves(argc, argv, at) ? "sandbox-python" : NULL);
    if (fd >= 0) syscall(SYS_execveat, fd, "", args, environ, AT_EMPTY_PATH);
    execv(SANDBOX_PYTHON, args);
    fprintf(stderr, "sandbox: cannot execute %s: %s\n", SANDBOX_PYTHON, strerror(errno));
    return 127;
}
