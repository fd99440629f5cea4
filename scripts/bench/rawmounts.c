/* The raw cost of a plan's bind mounts: unshare a mount namespace, make it private, then
 * for each "SOURCE FLAGS" line on stdin create an empty mount point on a scratch tmpfs,
 * bind SOURCE there and remount it read-only (FLAGS: r=ro n=nosuid d=nodev x=noexec).
 * Prints the nanoseconds the loop took. A baseline for the gofer's "gpu mounts" phase. */
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

int main(void) {
    char src[4096][512], flags[4096][8];
    int n = 0;
    while (n < 4096 && scanf("%511s %7s", src[n], flags[n]) == 2) n++;
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) { perror("ns"); return 1; }
    char dir[] = "/tmp/rawmountsXXXXXX";
    if (!mkdtemp(dir) || mount("tmpfs", dir, "tmpfs", 0, NULL)) { perror("tmpfs"); return 1; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        char dst[600];
        snprintf(dst, sizeof dst, "%s/m%d", dir, i);
        int fd = open(dst, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) { perror(dst); return 1; }
        close(fd);
        unsigned long f = MS_BIND | MS_REMOUNT;
        if (strchr(flags[i], 'r')) f |= MS_RDONLY;
        if (strchr(flags[i], 'n')) f |= MS_NOSUID;
        if (strchr(flags[i], 'd')) f |= MS_NODEV;
        if (strchr(flags[i], 'x')) f |= MS_NOEXEC;
        if (mount(src[i], dst, NULL, MS_BIND, NULL) || mount(NULL, dst, NULL, f, NULL)) { perror(src[i]); return 1; }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%ld\n", (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    return 0;
}
