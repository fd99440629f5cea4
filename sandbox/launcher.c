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
 * sandbox/launcher.py builds this file with SANDBOX_PYTHON (the interpreter, as argv[0]
 * names it) and SANDBOX_CODE (the program for -c) defined in a generated header.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include SANDBOX_CONFIG

extern char **environ;

int main(int argc, char **argv)
{
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
