/* file.h: opening the files a user names (case files, dumps, plugins)
 * without being stalled by what they turn out to be: a FIFO, a device, a
 * socket or a directory is refused before a byte is read from it (and,
 * when the path already names one, before it is opened at all). */
#ifndef QC_FILE_H
#define QC_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Open `path` read-only as a regular file: stat first (a special file is
 * refused without being opened), then open with O_NONBLOCK and fstat the
 * descriptor (the same check, now race-free), then clear O_NONBLOCK. *fd
 * (close-on-exec) and *size are set on QC_OK; errors read
 * "<what> 'path': ..." (what: "case", "dump", "plugin"). */
int qc_open_regular(const char *path, const char *what, int *fd, int64_t *size);

/* Read the regular file `path` whole, at most `max` bytes, into a malloc'd
 * NUL-terminated buffer (*len bytes before the NUL). A larger file is
 * refused naming the limit; so is a gzip-compressed one (qc_refuse_gzip). */
int qc_read_file(const char *path, const char *what, size_t max, char **buf, size_t *len);
/* The same, taking any bytes (a reader that decompresses gzip itself). */
int qc_read_file_any(const char *path, const char *what, size_t max, char **buf, size_t *len);

/* pread all of [off, off + n) of fd into buf, again after EINTR and short
 * reads: 0, an errno value, or -1 when the file ends first. No message
 * (any thread may call it; the caller names the file and dataset). */
int qc_pread_full(int fd, void *buf, size_t n, long long off);

/* 1 when the n bytes at head begin with gzip's magic bytes (1f 8b). */
int qc_is_gzip(const void *head, size_t n);
/* QC_EINPUT with "<what> 'path': is gzip-compressed: decompress it first"
 * when head (the file's first n bytes) is gzip's; else QC_OK. For inputs
 * read in place (cases, dumps, safetensors) that a .gz would garble. */
int qc_refuse_gzip(const char *what, const char *path, const void *head, size_t n);
/* The same on an open descriptor: its first two bytes, read with pread
 * (the offset is kept). A read error is left to the caller's own reads. */
int qc_refuse_gzip_fd(const char *what, const char *path, int fd);

#endif
