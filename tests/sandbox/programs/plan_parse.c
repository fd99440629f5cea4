/*
 * The executor's plan parser (sandbox/executor/plan.c) alone, with process.c's labels, for tests without root (tests/sandbox/test_frontend_plan.py):
 * the records on stdin, the fds they name opened from the files given, the parsed plan out
 * as lines, or "refused"; LSM labels are applied to the directory given for the procfs. Built with the header gofer/frontend_plan.py's c_defines() writes.
 * usage: plan_parse [FILE...] < RECORDS
 */
#include "executor.h"

int main(int argc, char **argv) {
    static char buf[MAX_REQUEST + 1];
    size_t n = fread(buf, 1, MAX_REQUEST, stdin);
    int fds[MAX_FDS], nfds = 0;
    for (int i = 1; i < argc && nfds < MAX_FDS; i++) fds[nfds++] = open(argv[i], O_RDONLY | O_CLOEXEC);
    static struct plan pl;
    const char *records = plan_records(buf, &n, fds, &nfds);
    if (records == NULL || parse(&pl, records, n, fds, nfds) < 0) {
        puts("refused");
        return 1;
    }
    printf("preserve %d detach %d nnp %d umask %o lastcap %d\n", pl.preserve, pl.detach, pl.nnp, pl.umask, pl.last_cap);
    printf("caps %llx %llx %llx %llx %llx\n", pl.bounding, pl.permitted, pl.inheritable, pl.effective, pl.ambient);
    printf("user %u %u groups", pl.uid, pl.gid);
    for (int i = 0; i < pl.ngroups; i++) printf(" %u", (unsigned)pl.groups[i]);
    printf("\n");
    for (int i = 0; i < pl.nrlimits; i++)
        printf("rlimit %d %llu %llu\n", pl.rlimits[i].resource, (unsigned long long)pl.rlimits[i].soft,
               (unsigned long long)pl.rlimits[i].hard);
    printf("ns %d cgroups %d cwd %d fifo %d\n", pl.nns, pl.ncgroups, pl.cwd >= 0, pl.fifo >= 0);
    if (pl.bpf) printf("seccomp %s flags %u\n", pl.early_seccomp ? "early" : "late", pl.seccomp_flags);
    if (pl.sched)
        printf("sched %u %llu %d %u %llu %llu %llu\n", pl.sc.policy, pl.sc.flags, pl.sc.nice, pl.sc.priority,
               pl.sc.runtime, pl.sc.deadline, pl.sc.period);
    if (pl.ioprio) printf("ioprio %d %d\n", pl.ioprio_class, pl.ioprio_level);
    if (pl.persona) printf("personality %lu\n", pl.persona_value);
    if (pl.console >= 0) printf("console %hu %hu\n", pl.rows, pl.cols);
    if (pl.proc >= 0) { /* (a directory standing in for the host's procfs: the labels written there) */
        printf("labels %s|%s\n", pl.apparmor ? pl.apparmor : "", pl.selinux ? pl.selinux : "");
        fflush(stdout);
        apply_labels(&pl);
    }
    if (pl.listener >= 0) printf("listener {\"pid\":%d,%s\n", pl.listener_pid, pl.listener_rest);
    if (pl.nhooks) printf("start-state %s\n", pl.start_state);
    for (int i = 0; i < pl.nhooks; i++) {
        printf("hook %d %s", pl.hooks[i].timeout, pl.hooks[i].path);
        for (int k = 0; k < pl.hooks[i].nargs + pl.hooks[i].nenv; k++)
            printf("%s%s", k == pl.hooks[i].nargs ? " | " : " ", pl.hook_items[pl.hooks[i].arg0 + k]);
        printf("\n");
    }
    for (int i = 0; i < pl.argc; i++) printf("arg %s\n", pl.argv[i]);
    for (int i = 0; i < pl.envc; i++) printf("env %s\n", pl.envp[i]);
    return 0;
}
