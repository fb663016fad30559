/* LD_PRELOAD shim for the power-cut tests (tests/support/power_cut.py): remembers what a
 * process made durable under one directory, so that the test can rebuild that directory as a
 * power cut would leave it.
 *
 * After every successful fsync/fdatasync of a descriptor whose path is under
 * $SYNCLOG_ROOT:
 *   - a regular file: its whole content at that moment is copied to
 *     $SYNCLOG_SHADOW/<seq> and "F <seq> <ino> <size> <t0> <t1> <path>" is appended to
 *     $SYNCLOG_SHADOW/log;
 *   - a directory: its entries ("f|d <ino> <name>" lines) are written to
 *     $SYNCLOG_SHADOW/<seq> and "D <seq> <ino> 0 <t0> <t1> <path>" is appended.
 * t0/t1: CLOCK_MONOTONIC nanoseconds when the sync was called and when it returned.
 * sync_file_range, msync and plain writes promise nothing on a power cut and are not
 * recorded. After a successful syncfs (the WAL journal's trim) every file and directory
 * under $SYNCLOG_ROOT is recorded as it was when the call was made. Not modelled (the
 * product uses none of them; tests/support/power_cut.py checks the log is not empty):
 * sync(), O_SYNC/O_DSYNC descriptors.
 *
 * Built by the test with gcc (cc -shared -fPIC -O2 synclog.c -o synclog.so -ldl). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <ftw.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long seq;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void fail(const char *what)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "synclog: %s: %s\n", what, strerror(errno));
    if (write(2, buf, n) < 0) { /* nothing more to say */ }
    abort();
}

/* The descriptor's path if it is $SYNCLOG_ROOT or under it, else 0. */
static int watched(int fd, char *path, size_t size)
{
    const char *root = getenv("SYNCLOG_ROOT");
    char link[64];
    if (root == NULL || getenv("SYNCLOG_SHADOW") == NULL)
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, size - 1);
    if (n < 0)
        return 0;
    path[n] = 0;
    size_t len = strlen(root);
    return strncmp(path, root, len) == 0 && (path[len] == 0 || path[len] == '/');
}

static void copy_file(int fd, int out, off_t size)
{
    /* A new descriptor for reading: the caller's may be write-only. */
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int in = open(link, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        fail("reopening a synced file");
    fd = in;
    off_t pos = 0;
    while (pos < size) {
        /* With an offset pointer sendfile leaves fd's own file position alone. */
        ssize_t n = sendfile(out, fd, &pos, (size_t)(size - pos));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail("copying a synced file");
        }
        if (n == 0)
            break;                  /* truncated meanwhile: keep what there was */
    }
    close(in);
}

static void list_dir(const char *path, int out)
{
    DIR *d = opendir(path);
    if (d == NULL && errno == ENOENT)
        return;                     /* removed meanwhile (syncfs walks by path) */
    if (d == NULL)
        fail("opening a synced directory");
    int dfd = dirfd(d);
    FILE *f = fdopen(dup(out), "w");
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;               /* removed meanwhile */
        if (S_ISDIR(st.st_mode))
            fprintf(f, "d %lu %s\n", (unsigned long)st.st_ino, e->d_name);
        else if (S_ISREG(st.st_mode))
            fprintf(f, "f %lu %s\n", (unsigned long)st.st_ino, e->d_name);
    }
    fclose(f);
    closedir(d);
}

/* One sync's copy: what a successful sync of a descriptor made durable. */
struct taken {
    char kind;                  /* 'F' or 'D' */
    int pid;
    unsigned long n;
    unsigned long ino;
    long long size;
    char path[PATH_MAX];
};

/* Copy what a sync of `fd` makes durable into the shadow directory (the mutex held);
 * returns 0 when `fd` is not watched. */
static int take(int fd, struct taken *t)
{
    struct stat st;
    if (!watched(fd, t->path, sizeof t->path) || fstat(fd, &st) != 0)
        return 0;
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return 0;
    const char *shadow = getenv("SYNCLOG_SHADOW");
    char name[PATH_MAX];
    t->n = ++seq;
    t->pid = (int)getpid();
    snprintf(name, sizeof name, "%s/%d-%lu", shadow, t->pid, t->n);
    int out = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        fail("creating a shadow copy");
    t->size = 0;
    if (S_ISREG(st.st_mode)) {
        t->size = st.st_size;
        copy_file(fd, out, st.st_size);
    } else {
        list_dir(t->path, out);
    }
    close(out);
    t->kind = S_ISDIR(st.st_mode) ? 'D' : 'F';
    t->ino = (unsigned long)st.st_ino;
    return 1;
}

static void emit(const struct taken *t, int64_t t0, int64_t t1)
{
    char logname[PATH_MAX];
    snprintf(logname, sizeof logname, "%s/log", getenv("SYNCLOG_SHADOW"));
    FILE *log = fopen(logname, "a");
    if (log == NULL)
        fail("opening the sync log");
    fprintf(log, "%c %d-%lu %lu %lld %lld %lld %s\n", t->kind, t->pid, t->n, t->ino,
            t->size, (long long)t0, (long long)t1, t->path);
    fclose(log);
}

static void record(int fd, int64_t t0)
{
    struct taken t;
    int saved = errno;
    pthread_mutex_lock(&lock);
    if (take(fd, &t))
        emit(&t, t0, now_ns());
    pthread_mutex_unlock(&lock);
    errno = saved;
}

/* syncfs: everything under $SYNCLOG_ROOT as it was when the call was made is durable once
 * it returns. Each file and directory is copied before the real call (what was written
 * before it), and the records are logged, with the time it returned, after it. */
static struct taken *walk_taken;
static size_t walk_count, walk_cap;

static int walk_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st; (void)ftw;
    if (type != FTW_F && type != FTW_D && type != FTW_DP)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (type == FTW_F ? 0 : O_DIRECTORY));
    if (fd < 0)
        return 0;                   /* removed meanwhile */
    if (walk_count == walk_cap) {
        walk_cap = walk_cap ? 2 * walk_cap : 256;
        walk_taken = realloc(walk_taken, walk_cap * sizeof *walk_taken);
        if (walk_taken == NULL)
            fail("growing the syncfs list");
    }
    if (take(fd, &walk_taken[walk_count]))
        walk_count++;
    close(fd);
    return 0;
}

int syncfs(int fd)
{
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    const char *root = getenv("SYNCLOG_ROOT");
    if (root == NULL || getenv("SYNCLOG_SHADOW") == NULL)
        return real(fd);
    pthread_mutex_lock(&lock);
    int64_t t0 = now_ns();
    walk_count = 0;
    int saved = errno;
    nftw(root, walk_one, 64, FTW_PHYS);
    errno = saved;
    int rc = real(fd);
    saved = errno;
    if (rc == 0) {
        int64_t t1 = now_ns();
        for (size_t i = 0; i < walk_count; i++)
            emit(&walk_taken[i], t0, t1);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

int fsync(int fd)
{
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int64_t t0 = now_ns();
    int rc = real(fd);
    if (rc == 0)
        record(fd, t0);
    return rc;
}

int fdatasync(int fd)
{
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int64_t t0 = now_ns();
    int rc = real(fd);
    if (rc == 0)
        record(fd, t0);
    return rc;
}
