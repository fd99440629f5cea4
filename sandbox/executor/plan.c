/* The process plan's records as sandbox/executor/frontend.c carries them out: received (recv_plan),
 * unwrapped from a memfd (plan_records) and parsed into struct plan (parse). gofer/frontend_plan.py
 * writes them. */
#include "executor.h"

static unsigned long long hex(const char *s) { return strtoull(s, NULL, 16); }

static const char *next_item(const char **p, const char *end) {
    const char *item = *p;
    const char *nul = memchr(item, '\0', (size_t)(end - item));
    if (nul == NULL) return NULL;
    *p = nul + 1;
    return item;
}

const char *plan_records(const char *buf, size_t *n, int *fds, int *nfds) {
    if (*n != sizeof PLAN_MEMFD || memcmp(buf, PLAN_MEMFD, sizeof PLAN_MEMFD) || *nfds < 1) return buf;
    struct stat st;
    char *file = NULL;
    int ok = fstat(fds[0], &st) == 0 && st.st_size > 0 && st.st_size <= PLAN_MAX_FILE
             && (file = malloc((size_t)st.st_size + 1)) != NULL && pread(fds[0], file, (size_t)st.st_size, 0) == st.st_size;
    close(fds[0]);
    memmove(fds, fds + 1, (size_t)(*nfds - 1) * sizeof *fds);
    (*nfds)--;
    if (!ok || (st.st_size == sizeof PLAN_MEMFD && !memcmp(file, PLAN_MEMFD, sizeof PLAN_MEMFD))) { /* (one level: never a memfd in a memfd) */
        free(file);
        return NULL;
    }
    file[st.st_size] = '\0';
    *n = (size_t)st.st_size;
    return file; /* (the plan's strings: kept while the plan is) */
}

/* The plan's records; -1 on anything malformed (the launcher then says so: never a guess).
 * The tables are as big as the plan's records ask (execve has the last word on the size). */
int parse(struct plan *pl, const char *buf, size_t n, int *fds, int nfds) {
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

ssize_t send_fds(int s, const void *data, size_t n, const int *fds, int nfds, int flags) {
    union { char buf[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = (void *)data, .iov_len = n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 4) {
        errno = EINVAL;
        return -1;
    }
    if (nfds > 0) {
        msg.msg_control = control.buf, msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t sent;
    do sent = sendmsg(s, &msg, flags); while (sent < 0 && errno == EINTR);
    return sent;
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
