/*
 * fsio.c: the file-system steps that make checkpoints durable and atomic
 * (lt.ckpt): writing a small file under a temporary name, fsyncing and
 * renaming it into place; fsyncing a directory so that renames inside it
 * survive a power cut; creating directories; renaming; removing a tree (old
 * checkpoints, half-written ones); and the SIGTERM/SIGUSR1 flag that asks a
 * training loop to save and stop (preemption by a scheduler such as Slurm).
 *
 * POSIX: rename() within one file system is atomic, and a file's data and
 * the directory entry naming it are made durable by fsync on each (see
 * fsync(2) and rename(2)).
 */
#include "lutra.h"
#include "base/status.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

lt_status lt_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return lt_fail(LT_ERR_IO, "cannot open the directory %s: %s", path, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0 && err != EINVAL) /* some file systems cannot sync directories */
    return lt_fail(LT_ERR_IO, "fsync of the directory %s failed: %s", path, strerror(err));
  return LT_OK;
}

/* the directory part of path ("." when there is none), in buf */
static const char *dir_of(const char *path, char *buf, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    return ".";
  size_t n = (size_t)(slash - path);
  if (n == 0)
    return "/";
  if (n >= cap)
    n = cap - 1;
  memcpy(buf, path, n);
  buf[n] = 0;
  return buf;
}

lt_status lt_write_file_atomic(const char *path, const char *data, int64_t len) {
  LT_OP_SCOPE("write_file_atomic");
  if (len < 0)
    return lt_fail(LT_ERR_ARG, "write %s: negative length %lld", path, (long long)len);
  size_t tl = strlen(path) + 32;
  char *tmp = malloc(tl);
  if (!tmp)
    return lt_fail(LT_ERR_OOM, "write %s: out of memory", path);
  snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
  lt_status st = LT_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = lt_fail(LT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    free(tmp);
    return st;
  }
  int64_t done = 0;
  while (st == LT_OK && done < len) {
    ssize_t w = write(fd, data + done, (size_t)(len - done));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      st = lt_fail(LT_ERR_IO, "write %s: %s (%lld of %lld bytes written)", tmp, w < 0 ? strerror(errno) : "no progress",
                   (long long)done, (long long)len);
    else
      done += w;
  }
  if (st == LT_OK && fsync(fd) != 0)
    st = lt_fail(LT_ERR_IO, "fsync of %s failed: %s", tmp, strerror(errno));
  if (close(fd) != 0 && st == LT_OK)
    st = lt_fail(LT_ERR_IO, "close of %s failed: %s", tmp, strerror(errno));
  if (st == LT_OK && rename(tmp, path) != 0)
    st = lt_fail(LT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (st != LT_OK)
    unlink(tmp);
  free(tmp);
  if (st == LT_OK) {
    char buf[4096];
    st = lt_fsync_dir(dir_of(path, buf, sizeof buf));
  }
  return st;
}

lt_status lt_mkdir_p(const char *path) {
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p)
    return lt_fail(LT_ERR_OOM, "mkdir %s: out of memory", path);
  memcpy(p, path, n + 1);
  lt_status st = LT_OK;
  for (size_t i = 1; i <= n && st == LT_OK; i++) {
    if (p[i] != '/' && p[i] != 0)
      continue;
    char c = p[i];
    p[i] = 0;
    struct stat sb;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      st = lt_fail(LT_ERR_IO, "cannot create the directory %s: %s", p, strerror(errno));
    else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
      st = lt_fail(LT_ERR_IO, "%s exists and is not a directory", p);
    p[i] = c;
  }
  free(p);
  return st;
}

lt_status lt_rename(const char *from, const char *to) {
  if (rename(from, to) != 0)
    return lt_fail(LT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
  return LT_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

lt_status lt_remove_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return errno == ENOENT ? LT_OK : lt_fail(LT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
  if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return lt_fail(LT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
  return LT_OK;
}

lt_status lt_dir_entries(const char *path, char **names, int64_t *len) {
  *names = NULL;
  *len = 0;
  DIR *d = opendir(path);
  if (!d)
    return lt_fail(LT_ERR_IO, "cannot list the directory %s: %s", path, strerror(errno));
  size_t cap = 256, n = 0;
  char *buf = malloc(cap);
  lt_status st = buf ? LT_OK : lt_fail(LT_ERR_OOM, "listing %s: out of memory", path);
  struct dirent *e;
  while (st == LT_OK && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    size_t l = strlen(e->d_name) + 1;
    if (n + l > cap) {
      while (n + l > cap)
        cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        st = lt_fail(LT_ERR_OOM, "listing %s: out of memory", path);
        break;
      }
      buf = nb;
    }
    memcpy(buf + n, e->d_name, l);
    n += l;
  }
  closedir(d);
  if (st != LT_OK) {
    free(buf);
    return st;
  }
  *names = buf;
  *len = (int64_t)n;
  return LT_OK;
}

int lt_process_alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

int lt_path_kind(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return 0;
  return S_ISDIR(sb.st_mode) ? 2 : 1;
}

/* ---- preemption ---------------------------------------------------------------- */

static volatile sig_atomic_t preempt_signal;
static struct sigaction saved_term, saved_usr1;
static int watching;

static void on_preempt(int sig) { preempt_signal = sig; }

void lt_preempt_watch(int on) {
  if (on && !watching) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_preempt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &saved_term);
    sigaction(SIGUSR1, &sa, &saved_usr1);
    watching = 1;
  } else if (!on && watching) {
    sigaction(SIGTERM, &saved_term, NULL);
    sigaction(SIGUSR1, &saved_usr1, NULL);
    watching = 0;
  }
}

int lt_preempt_signal(void) { return preempt_signal; }

void lt_preempt_clear(void) { preempt_signal = 0; }
