/* The raw cost of the mount syscalls of a plan, as a minimal C loop. In a new private mount
 * namespace, reads lines from stdin and times them all:
 *   T DIR                 mount a tmpfs on DIR (what the spec does for /dev)
 *   O DIR                 overlay DIR onto itself, upper and work dirs on a scratch tmpfs
 *   D DIR                 mkdir -p DIR (a directory the plan's targets need)
 *   B SRC DST FLAGS       create an empty file DST, bind SRC onto it, remount with FLAGS
 *                         (r=ro n=nosuid d=nodev x=noexec, - for none)
 * Prints the nanoseconds the loop took. The baseline for the gofer's GPU mount phase. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX = 4096 };
static char op[MAX], a[MAX][512], b[MAX][512], fl[MAX][8];

int main(void) {
    int n = 0;
    char line[1200];
    while (n < MAX && fgets(line, sizeof line, stdin)) {
        int got = sscanf(line, " %c %511s %511s %7s", &op[n], a[n], b[n], fl[n]);
        if (got >= 2) n++;
    }
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) { perror("ns"); return 1; }
    char scratch[] = "/tmp/rawmountsXXXXXX";
    if (!mkdtemp(scratch) || mount("tmpfs", scratch, "tmpfs", 0, NULL)) { perror("tmpfs"); return 1; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        if (op[i] == 'T') {
            if (mount("tmpfs", a[i], "tmpfs", MS_NOSUID, "mode=755")) { perror(a[i]); return 1; }
        } else if (op[i] == 'D') {
            for (char *p = a[i] + 1; ; p++) {
                if (*p == '/' || *p == 0) {
                    char c = *p;
                    *p = 0;
                    mkdir(a[i], 0755);
                    *p = c;
                    if (!c) break;
                }
            }
        } else if (op[i] == 'O') {
            char upper[600], work[600], opts[2000];
            snprintf(upper, sizeof upper, "%s/u%d", scratch, i);
            snprintf(work, sizeof work, "%s/w%d", scratch, i);
            mkdir(upper, 0755);
            mkdir(work, 0755);
            snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", a[i], upper, work);
            if (mount("overlay", a[i], "overlay", 0, opts)) { perror(a[i]); return 1; }
        } else {
            int fd = open(b[i], O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
            if (fd < 0) { perror(b[i]); return 1; }
            close(fd);
            unsigned long f = MS_BIND | MS_REMOUNT;
            if (strchr(fl[i], 'r')) f |= MS_RDONLY;
            if (strchr(fl[i], 'n')) f |= MS_NOSUID;
            if (strchr(fl[i], 'd')) f |= MS_NODEV;
            if (strchr(fl[i], 'x')) f |= MS_NOEXEC;
            if (mount(a[i], b[i], NULL, MS_BIND, NULL) || mount(NULL, b[i], NULL, f, NULL)) { perror(b[i]); return 1; }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%ld\n", (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
    /* the mounts go with this namespace; the directory made in the host's /tmp would stay */
    if (umount2(scratch, MNT_DETACH) || rmdir(scratch)) { perror(scratch); return 1; }
    return 0;
}
