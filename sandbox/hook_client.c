/* sandbox-hook: the client of the warm hook server (sandbox/hook_server.py) as a small C
 * program, so that a hook served warm costs no Python start (~8 ms of every GPU container's
 * start under runc or crun). sandbox/launcher.py builds it (scripts/setup: into .venv/bin/sandbox-hook) and
 * `sandbox hook install` writes it into the hook entry:
 *
 *     sandbox-hook PYTHON -I -S -c CODE hook [--driver-root D] ... [--server SOCKET]
 *     sandbox-hook PYTHON -I -S -c CODE cdi hook [--link L] ...     (our CDI spec's hook)
 *
 * argv[1:] is the whole Python hook. The client sends {"argv": <from "hook" (or "cdi") on>, "stdin":
 * <the container state>} to SOCKET (default /run/gpu-sandbox/hook.sock), as the Python client
 * does, and prints the server's error line and exits with its code. Whenever the server is
 * of no use (none listens, it is not root's, it declines, the request is too big, --trace
 * is asked for) it execs argv[1:] with the state on stdin again:
 * the hook then does the work itself, exactly as without this program. Where none listens
 * and the hook runs as the node's root, it starts one first (server_connect.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "server_connect.h"
#include "server_wire.h"

/* The Python hook, with the state it would have read on stdin. Never returns. */
static void fallback(char **cmd, const char *state, size_t n) {
    int fd = memfd_create("hook-state", MFD_CLOEXEC);
    if (fd >= 0) {
        size_t off = 0;
        while (off < n) {
            ssize_t w = write(fd, state + off, n - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        if (off == n && lseek(fd, 0, SEEK_SET) == 0 && dup2(fd, 0) == 0) {
            execv(cmd[0], cmd);
        }
    }
    fprintf(stderr, "sandbox hook: cannot run %s: %s\n", cmd[0], strerror(errno));
    exit(1);
}

static void print_error(const char *p) {
    if (*p != '"') return;
    char out[4096];
    size_t o = 0;
    for (p++; *p && *p != '"' && o < sizeof out - 4; p++) {
        if (*p != '\\') { out[o++] = *p; continue; }
        p++;
        switch (*p) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'u': {
            unsigned v = 0;
            for (int j = 1; j <= 4; j++) { /* exactly four hex digits, never past the NUL */
                char h = p[j];
                int x = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
                if (x < 0) return;
                v = v << 4 | (unsigned)x;
            }
            p += 4;
            if (v < 0x80) out[o++] = (char)v;
            else if (v < 0x800) out[o++] = (char)(0xc0 | v >> 6), out[o++] = (char)(0x80 | (v & 0x3f));
            else out[o++] = (char)(0xe0 | v >> 12), out[o++] = (char)(0x80 | (v >> 6 & 0x3f)),
                 out[o++] = (char)(0x80 | (v & 0x3f));
            break;
        }
        case '\0': return;
        default: out[o++] = *p;
        }
    }
    if (o) fprintf(stderr, "sandbox hook: %.*s\n", (int)o, out);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: sandbox-hook PYTHON ARGS... hook [HOOK OPTIONS]\n");
        return 2;
    }
    char **cmd = argv + 1;
    int hook = -1;
    const char *path = DEFAULT_SOCKET;
    for (int i = 2; i < argc; i++) {
        if (hook < 0 && strcmp(argv[i], "hook") == 0) hook = strcmp(argv[i - 1], "cdi") == 0 ? i - 1 : i; /* (cdi hook) */
        else if (hook >= 0 && strcmp(argv[i], "--trace") == 0) hook = -2; /* the hook's own to write */
        else if (hook >= 0 && strcmp(argv[i], "--server") == 0 && i + 1 < argc) path = argv[i + 1];
        if (hook == -2) break;
    }

    struct buf state = {0};
    char chunk[65536];
    for (;;) { /* all of it, however big: a fallback replays it whole */
        ssize_t r = read(0, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) break;
        if (r < 0 || put_max(&state, chunk, (size_t)r, (size_t)-1 / 4)) {
            fprintf(stderr, "sandbox hook: cannot read the container state on stdin: %s\n",
                    r < 0 ? strerror(errno) : "out of memory");
            return 1;
        }
    }
    if (hook < 0 || state.n >= MAX_REQUEST) fallback(cmd, state.p, state.n);

    struct buf req = {0};
    int bad = put(&req, "{\"argv\": [", 10);
    for (int i = hook; i < argc && !bad; i++) {
        bad = (i > hook && put(&req, ", ", 2)) || json_string(&req, argv[i], strlen(argv[i]));
    }
    char cwd[PATH_MAX]; /* (relative paths are ours: runc starts a hook in the bundle) */
    bad = bad || getcwd(cwd, sizeof cwd) == NULL;
    bad = bad || put(&req, "], \"cwd\": ", 10) || json_string(&req, cwd, strlen(cwd));
    bad = bad || put(&req, ", \"stdin\": ", 11) || json_string(&req, state.p ? state.p : "", state.n);
    for (int i = 1; i + 1 < hook && !bad; i++) /* the program: the Python hook's -c CODE */
        if (strcmp(argv[i], "-c") == 0)
            bad = put(&req, ", \"program\": ", 13) || json_string(&req, argv[i + 1], strlen(argv[i + 1]));
    bad = bad || put(&req, "}", 1);
    if (bad) fallback(cmd, state.p, state.n);

    /* deadlines as the Python client's (sandbox/hook_server.py): connect and send 1 s (a full
     * listen queue), the answer REPLY_TIMEOUT; past either, the hook does the work itself.
     * Where none listens, the node's root starts one: the Python hook's command line, up to
     * its verb, with `serve` (server_connect.h) */
    int s = server_connect(path, cmd, hook - 1);
    struct timeval reply_limit = {.tv_sec = REPLY_TIMEOUT};
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &reply_limit, sizeof reply_limit) < 0
        || send(s, req.p, req.n, 0) != (ssize_t)req.n) {
        if (s >= 0) close(s);
        fallback(cmd, state.p, state.n);
    }
    char *reply = malloc(MAX_REQUEST + 1);
    ssize_t r;
    do r = recv(s, reply, MAX_REQUEST, 0); while (r < 0 && errno == EINTR);
    close(s);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        fprintf(stderr, "sandbox hook: no answer from the hook server at %s in %d s: doing the work here\n",
                path, REPLY_TIMEOUT);
        fallback(cmd, state.p, state.n);
    }
    if (r <= 0) {
        fprintf(stderr, "sandbox hook: the hook server at %s died before it answered\n", path);
        return 1;
    }
    reply[r] = '\0';
    if (field(reply, "fallback")) fallback(cmd, state.p, state.n); /* the server declined */
    const char *code = field(reply, "code"), *error = field(reply, "error");
    char *end = NULL;
    long n = code ? strtol(code, &end, 10) : 0;
    if (!code || end == code) {
        fprintf(stderr, "sandbox hook: the hook server at %s gave no exit code\n", path);
        return 1;
    }
    if (error) print_error(error);
    return (int)(n & 0xff);
}
