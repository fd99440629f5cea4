/*
 * An attacker in a container that holds CAP_SYS_PTRACE (CVE-2019-5736's class): it watches
 * every other process of its pid namespace and opens each one's exe, cwd, root, fds and
 * mapped files, as the attack would keep them, then asks whether each file would open for
 * writing (without writing anything). One line per new (pid, link, file):
 *
 *     pid comm link dev ino type werr sealed ro
 *
 * type: f regular, d directory, o other; werr: 0 if it opened for writing, else the errno
 * (ETXTBSY is only "busy now": the attack waits); sealed: 1 for a memfd sealed against
 * writes; ro: 1 on a read-only mount. Runs until the file STOP exists. When the file MARK
 * appears it is removed, "MARK" is written, and what was seen is forgotten.
 * usage: watcher OUT STOP MARK
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SEEN_MAX 65536
static unsigned long long seen[SEEN_MAX];
static int nseen;

static int first_time(unsigned long long key)
{
    for (int i = 0; i < nseen; i++)
        if (seen[i] == key)
            return 0;
    if (nseen < SEEN_MAX)
        seen[nseen++] = key;
    return 1;
}

static void look(FILE *out, int pid, const char *comm, const char *link)
{
    char path[512], self[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, link);
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0) {
        unsigned long long key = ((unsigned long long)pid << 40) ^ ((unsigned long long)st.st_dev << 32) ^ st.st_ino
                                 ^ (unsigned long long)(strlen(link) * 2654435761u);
        if (first_time(key)) {
            char type = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : 'o';
            int werr = -1, sealed = 0;
            if (type == 'f') {
                snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
                int w = open(self, O_WRONLY | O_CLOEXEC);
                werr = w < 0 ? errno : 0;
                if (w >= 0) {
                    int seals = fcntl(w, F_GET_SEALS);
                    sealed = seals >= 0 && (seals & F_SEAL_WRITE);
                    close(w);
                }
            }
            struct statvfs vfs;
            int ro = fstatvfs(fd, &vfs) == 0 && (vfs.f_flag & ST_RDONLY);
            fprintf(out, "%d %s %s %llu %llu %c %d %d %d\n", pid, comm, link, (unsigned long long)st.st_dev,
                    (unsigned long long)st.st_ino, type, werr, sealed, ro);
            fflush(out);
        }
    }
    close(fd);
}

static void look_dir(FILE *out, int pid, const char *comm, const char *sub)
{
    char path[256], link[512];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, sub);
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(link, sizeof link, "%s/%s", sub, e->d_name);
        look(out, pid, comm, link);
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    FILE *out = fopen(argv[1], "w");
    if (out == NULL)
        return 1;
    int me = getpid();
    while (access(argv[2], F_OK) != 0) {
        if (unlink(argv[3]) == 0) {
            nseen = 0;
            fprintf(out, "MARK\n");
            fflush(out);
        }
        DIR *proc = opendir("/proc");
        if (proc == NULL)
            return 1;
        struct dirent *e;
        while ((e = readdir(proc)) != NULL) {
            int pid = atoi(e->d_name);
            if (pid <= 0 || pid == me)
                continue;
            char path[64], comm[64] = "?";
            snprintf(path, sizeof path, "/proc/%d/comm", pid);
            FILE *f = fopen(path, "r");
            if (f != NULL) {
                if (fgets(comm, sizeof comm, f) != NULL)
                    comm[strcspn(comm, "\n ")] = 0;
                fclose(f);
            }
            look(out, pid, comm, "exe");
            look(out, pid, comm, "cwd");
            look(out, pid, comm, "root");
            look_dir(out, pid, comm, "fd");
            look_dir(out, pid, comm, "map_files");
        }
        closedir(proc);
    }
    fclose(out);
    return 0;
}
