/*
 * The `sandbox` executable: starts our Python (isolated, no site, the installation's import
 * paths baked in) from a read-only view of the interpreter (CVE-2019-5736).
 *
 * Processes of ours that a container can see before they exec (a created init, the child of
 * `sandbox exec`, an init created into a pid namespace with other tenants) are the host's
 * interpreter. A container process holding CAP_SYS_PTRACE reads past their non-dumpable
 * flag: it keeps /proc/<pid>/exe open and rewrites the host's interpreter once it is no
 * longer busy. So the interpreter is executed from a detached, read-only bind mount of
 * itself (open_tree + mount_setattr, never attached anywhere): /proc/<pid>/exe then leads to
 * a mount the kernel refuses to write through (EROFS), with no copy of the file (runc 1.2
 * seals itself the same way, with an overlay). Where the kernel refuses (not root, a kernel
 * before 5.12) the interpreter runs as it is, and sandbox/sealed.py re-executes the verbs
 * that reach a container from a sealed memfd copy instead.
 *
 * A verb that starts no process of the container's (state, kill, delete, start, ...: the
 * warm server's SERVED) is first offered to the warm server (sandbox/hook_server.py, at
 * $SANDBOX_SERVER or /run/gpu-sandbox/hook.sock; SANDBOX_SERVER= never): the request carries
 * the command line, the cwd, the umask and the environment, and this process's stdin, stdout
 * and stderr as SCM_RIGHTS, so the server's forked child writes where the verb would, and
 * the exit code comes back. No Python starts here. Where the server is of no use (none
 * listens, it is not root's, it declines, a full queue for a second, an argument that is not
 * UTF-8) the verb runs here as before. `exec`, `create` and `run` go the same way after this
 * program has re-executed itself from a read-only view of itself: the server answers with a
 * plan that frontend.c carries out in this process tree (sandbox/exec_frontend.py,
 * sandbox/create_frontend.py).
 *
 * sandbox/launcher.py builds this file with SANDBOX_PYTHON (the interpreter, as argv[0]
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include SANDBOX_CONFIG
#include "frontend.h"

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

static int json_strings(struct buf *b, char **v, int n) {
    for (int i = 0; i < n; i++)
        if ((i && put(b, ", ", 2)) || !utf8((unsigned char *)v[i], strlen(v[i])) || json_string(b, v[i], strlen(v[i])))
            return -1;
    return 0;
}

static const char *server_path(void) {
    const char *path = getenv("SANDBOX_SERVER");
    return path ? path : DEFAULT_SOCKET;
}

/* The request (command line, cwd, umask, environment; stdio as SCM_RIGHTS) sent to the warm
 * server: its connection, or -1 where there is none to use. */
static int send_request(int argc, char **argv) {
    const char *path = server_path();
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (*path == '\0' || strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0) return -1; /* a closed stdio: as Python copes with it */
    char cwd[PATH_MAX], mask[16];
    if (getcwd(cwd, sizeof cwd) == NULL) return -1;
    mode_t old = umask(0);
    umask(old);
    snprintf(mask, sizeof mask, "%u", (unsigned)old);
    int n = 0;
    while (environ[n]) n++;
    struct buf req = {0};
    if (put(&req, "{\"verb\": [", 10) || json_strings(&req, argv + 1, argc - 1) || put(&req, "], \"cwd\": ", 10)
        || !utf8((unsigned char *)cwd, strlen(cwd)) || json_string(&req, cwd, strlen(cwd))
        || put(&req, ", \"umask\": ", 11) || put(&req, mask, strlen(mask)) || put(&req, ", \"env\": [", 10)
        || json_strings(&req, environ, n) || put(&req, "]}", 2)) {
        drop(&req);
        return -1;
    }
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct ucred cred;
    socklen_t len = sizeof cred;
    struct timeval limit = {.tv_sec = 1}; /* connect and send: a full listen queue, as the hook's */
    int fds[3] = {0, 1, 2};
    union { char buf[CMSG_SPACE(sizeof fds)]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = req.p, .iov_len = req.n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) < 0
        || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0
        || getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != 0
        || sendmsg(s, &msg, 0) != (ssize_t)req.n) {
        if (s >= 0) close(s);
        drop(&req);
        return -1;
    }
    drop(&req);
    return s;
}

/* The verb run by the warm server's child: its exit code, or -1 where the server is of no use. */
static int served(int argc, char **argv) {
    int s = send_request(argc, argv);
    if (s < 0) return -1;
    char reply[4096];
    ssize_t r;
    int running = 0;
    for (;;) { /* {"running"} once the server's child takes the verb up, then {"code"} */
        do r = recv(s, reply, sizeof reply - 1, 0); while (r < 0 && errno == EINTR);
        if (r <= 0 || running) break;
        reply[r] = '\0';
        if (!field(reply, "running")) break;
        running = 1;
    }
    close(s);
    if (r <= 0 && !running) return -1; /* never taken up (a server stopping, a failed socket unit): here */
    if (r <= 0) {
        fprintf(stderr, "sandbox: the server at %s died before it answered\n", server_path());
        return 1;
    }
    reply[r] = '\0';
    if (field(reply, "fallback")) return -1; /* the server declined: the verb runs here */
    const char *code = field(reply, "code");
    char *end = NULL;
    long v = code ? strtol(code, &end, 10) : 0;
    if (!code || end == code) {
        fprintf(stderr, "sandbox: the server at %s gave no exit code\n", server_path());
        return 1;
    }
    return (int)(v & 0xff);
}

/* exec, create or run, planned by the server and carried out here (frontend.c): its exit code,
 * or -1 where the server is of no use (nothing has happened yet: the verb runs in Python). */
static int served_plan(int argc, char **argv, int at) {
    int s = send_request(argc, argv);
    if (s < 0) return -1;
    char *buf = malloc(MAX_REQUEST + 1);
    int fds[MAX_FDS], nfds = 0;
    ssize_t r = buf != NULL ? recv_plan(s, buf, fds, &nfds) : -1;
    if (r < 0) {
        close(s);
        free(buf);
        return -1; /* never taken up, or a plan too big for us: the verb in Python */
    }
    if (strncmp(buf, "plan", 4) == 0) return frontend_exec(s, buf, (size_t)r, fds, nfds, argv);
    if (strncmp(buf, "clone", 5) == 0) return frontend_create(s, buf, (size_t)r, fds, nfds, argv, at);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    close(s); /* {"fallback"}, or {"code"}: the error already printed */
    int code = field(buf, "fallback") ? -1 : (field(buf, "code") ? atoi(field(buf, "code")) & 0xff : 1);
    free(buf);
    return code;
}

/* Whether this very program runs from a read-only mount (a sealed view of itself). */
static int sealed(void) {
    struct statvfs st;
    return statvfs("/proc/self/exe", &st) == 0 && (st.f_flag & ST_RDONLY);
}

/* This program again, from a detached read-only bind of itself (as the interpreter below):
 * the exec front end joins the container before it execs, and must not be a host file the
 * container could write. Returns only where the kernel refuses. */
static void seal(char **argv) {
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, "/proc/self/exe", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (fd < 0) return;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0)
        syscall(SYS_execveat, fd, "", argv, environ, AT_EMPTY_PATH);
    close(fd);
}

static int server_listens(void) {
    struct stat st;
    return stat(server_path(), &st) == 0 && S_ISSOCK(st.st_mode);
}

int main(int argc, char **argv)
{
    signal(SIGCHLD, SIG_DFL); /* (a caller's SIG_IGN would have waitpid fail: Python's too) */
    int at = verb_at(argc, argv);
    const char *verb = at ? argv[at] : NULL;
    if (verb && listed(served_verbs, verb)) {
        int code = served(argc, argv);
        if (code >= 0)
            return code;
    }
    if (verb && (!strcmp(verb, "exec") || !strcmp(verb, "create") || !strcmp(verb, "run")) && server_listens()) {
        if (!sealed())
            seal(argv);
        if (sealed()) {
            int code = served_plan(argc, argv, at);
            if (code >= 0)
                return code;
        }
    }
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (args == NULL)
        return 1;
    args[0] = SANDBOX_PYTHON;
    args[1] = "-IS";
    args[2] = "-c";
    args[3] = SANDBOX_CODE;
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];

    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, SANDBOX_PYTHON, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (fd >= 0) {
        struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
        if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0)
            syscall(SYS_execveat, fd, "", args, environ, AT_EMPTY_PATH);
        close(fd);
    }
    execv(SANDBOX_PYTHON, args);
    fprintf(stderr, "sandbox: cannot execute %s: %s\n", SANDBOX_PYTHON, strerror(errno));
    return 127;
}
