/* file.c: see file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"

/* What a non-regular file is, in words. */
static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

static int refuse(const char *what, const char *path, mode_t m) {
  qc_err("%s '%s': %s, not a regular file: refused before reading it", what, path, kind_of(m));
  qc_hint("give the path of a regular file (a FIFO or device would block or never end)");
  return QC_EINPUT;
}

int qc_open_regular(const char *path, const char *what, int *fd, int64_t *size) {
  struct stat st;
  *fd = -1;
  *size = 0;
  if (stat(path, &st) != 0) return qc_err("%s '%s': cannot open: %s", what, path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return refuse(what, path, st.st_mode);
  int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f < 0) return qc_err("%s '%s': cannot open: %s", what, path, strerror(errno));
  if (fstat(f, &st) != 0) {
    int e = errno;
    close(f);
    return qc_err("%s '%s': cannot stat: %s", what, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(f);
    return refuse(what, path, st.st_mode);
  }
  int fl = fcntl(f, F_GETFL);
  if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    int e = errno;
    close(f);
    return qc_err("%s '%s': cannot set blocking reads: %s", what, path, strerror(e));
  }
  *fd = f;
  *size = (int64_t)st.st_size;
  return QC_OK;
}

int qc_pread_full(int fd, void *buf, size_t n, long long off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (long long)got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno ? errno : EIO;
    if (r == 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int qc_is_gzip(const void *head, size_t n) {
  const unsigned char *h = head;
  return n >= 2 && h[0] == 0x1f && h[1] == 0x8b;
}

int qc_refuse_gzip(const char *what, const char *path, const void *head, size_t n) {
  if (!qc_is_gzip(head, n)) return QC_OK;
  qc_err("%s '%s': is gzip-compressed: decompress it first (gunzip)", what, path);
  return QC_EINPUT;
}

int qc_refuse_gzip_fd(const char *what, const char *path, int fd) {
  unsigned char h[2];
  ssize_t r;
  do r = pread(fd, h, 2, 0);
  while (r < 0 && errno == EINTR);
  return r == 2 ? qc_refuse_gzip(what, path, h, 2) : QC_OK;
}

int qc_read_file(const char *path, const char *what, size_t max, char **buf, size_t *len) {
  int rc = qc_read_file_any(path, what, max, buf, len);
  if (!rc && (rc = qc_refuse_gzip(what, path, *buf, *len))) {
    free(*buf);
    *buf = NULL;
    *len = 0;
  }
  return rc;
}

int qc_read_file_any(const char *path, const char *what, size_t max, char **buf, size_t *len) {
  int fd;
  int64_t size;
  *buf = NULL;
  *len = 0;
  int rc = qc_open_regular(path, what, &fd, &size);
  if (rc) return rc;
  if ((uint64_t)size > max) {
    close(fd);
    return qc_err("%s '%s': %lld bytes: larger than the limit of %zu bytes", what, path, (long long)size, max);
  }
  char *b = qc_malloc((size_t)size + 1, what);
  if (!b) { close(fd); return QC_ESYS; }
  size_t got = 0;
  while (got < (size_t)size) {
    ssize_t r = read(fd, b + got, (size_t)size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(b);
      close(fd);
      return qc_err("%s '%s': read failed: %s", what, path, strerror(e));
    }
    if (r == 0) break; /* shrank while reading: take what is there */
    got += (size_t)r;
  }
  close(fd);
  b[got] = 0;
  *buf = b;
  *len = got;
  return QC_OK;
}
