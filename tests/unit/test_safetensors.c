/* test_safetensors.c: the safetensors reader (io/safetensors.h) on file
 * images built here: tensors found by name with their dtypes and shapes
 * (F4 in the float4_e2m1fn_x2 storage shape), bytes and slices read as
 * stored, from memory and from a file (pread and mmap); each refusal (header over
 * 100 MB, offsets past the end, overlapping tensors, a byte count that is
 * not dtype x shape, an unknown dtype, bad JSON, trailing bytes, odd F4)
 * is QC_EINPUT with a message naming the tensor. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/safetensors.h"

/* A file image: 8-byte length, the header, then `dlen` data bytes k & 0xff. */
static unsigned char *image(const char *hdr, size_t dlen, size_t *len) {
  size_t h = strlen(hdr);
  *len = 8 + h + dlen;
  unsigned char *b = malloc(*len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(b + 8, hdr, h);
  for (size_t k = 0; k < dlen; k++) b[8 + h + k] = (unsigned char)k;
  return b;
}

/* Parse hdr + dlen bytes; returns the status, the handle in *out. */
static int parse(const char *hdr, size_t dlen, unsigned char **img, qc_st **out) {
  size_t len;
  *img = image(hdr, dlen, &len);
  qc_err_clear();
  return qc_st_parse(*img, len, "t.safetensors", out);
}

static void refused(const char *hdr, size_t dlen, const char *needle) {
  unsigned char *img;
  qc_st *st = NULL;
  int rc = parse(hdr, dlen, &img, &st);
  cr_expect_eq(rc, QC_EINPUT, "header %s: expected QC_EINPUT, got %d", hdr, rc);
  cr_expect(st == NULL);
  cr_expect(strstr(qc_err_msg(), needle) != NULL, "message '%s' does not name '%s'", qc_err_msg(), needle);
  qc_st_close(st);
  free(img);
}

Test(safetensors, tensors_by_name) {
  const char *hdr = "{\"__metadata__\": {\"format\": \"pt\"},"
                    "\"b.w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]},"
                    "\"a.scale\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [12, 16]},"
                    "\"c.q\": {\"dtype\": \"F4\", \"shape\": [2, 4], \"data_offsets\": [16, 20]},"
                    "\"d.e\": {\"dtype\": \"F8_E4M3\", \"shape\": [3, 2, 2], \"data_offsets\": [20, 32]},"
                    "\"e.i\": {\"dtype\": \"I16\", \"shape\": [2], \"data_offsets\": [32, 36]}}   ";
  unsigned char *img;
  qc_st *st;
  cr_assert_eq(parse(hdr, 36, &img, &st), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_st_count(st), 5);
  cr_expect_str_eq(qc_st_at(st, 0)->name, "a.scale"); /* sorted by name */
  const qc_st_tensor *w = qc_st_find(st, "b.w"), *s = qc_st_find(st, "a.scale"), *q = qc_st_find(st, "c.q");
  cr_assert(w && s && q);
  cr_expect(qc_st_find(st, "nothere") == NULL);
  cr_expect_eq(w->dtype, QC_BF16);
  cr_expect_eq(w->ndim, 2);
  cr_expect_eq(w->nbytes, 12);
  cr_expect_eq(s->ndim, 0);
  cr_expect_eq(q->dtype, QC_E2M1X2);
  cr_expect_eq(q->shape[1], 2, "F4 [2, 4] is float4_e2m1fn_x2 [2, 2]");
  cr_expect_eq(q->st_last, 4);
  qc_tensor t;
  cr_assert_eq(qc_st_load(st, "b.w", "weight", &t), QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(t.name, "weight");
  for (int k = 0; k < 12; k++) cr_expect_eq(((unsigned char *)t.data)[k], k);
  qc_tensor_free(&t);
  unsigned char sl[4];
  cr_assert_eq(qc_st_read(st, qc_st_find(st, "d.e"), 2, sl, 4), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(sl[0], 28, "slice 2 of [3, 2, 2] starts at byte 8 of the tensor");
  cr_expect_eq(qc_st_read(st, qc_st_find(st, "d.e"), 3, sl, 4), QC_EINPUT, "slice out of range");
  qc_err_clear();
  cr_expect_eq(qc_st_load(st, "e.i", NULL, &t), QC_EINPUT, "I16 is listed but not read");
  cr_expect(strstr(qc_err_msg(), "I16") != NULL, "%s", qc_err_msg());
  qc_st_close(st);
  free(img);
}

Test(safetensors, refusals_name_the_cause) {
  refused("{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]}}", 8, "run past the end");
  refused("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
          "\"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [4, 12]}}", 12, "overlap");
  refused("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 12]}}", 24,
          "'w' holds 12 bytes: expected 24 (F32 x 6 elements)");
  refused("{\"w\": {\"dtype\": \"F7\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2, "unknown dtype 'F7'");
  refused("{\"w\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", 2, "do not fill whole bytes");
  refused("{\"w\": {\"dtype\": \"F4\", \"shape\": [2, 3], \"data_offsets\": [0, 3]}}", 3, "last dimension 3 is odd");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 0]}}", 2, "end before they begin");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [-2], \"data_offsets\": [0, 2]}}", 2, "shape entry 0");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0]}}", 2, "data_offsets must be");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [2]}}", 2, "expected string 'dtype'");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}", 2, "not valid JSON");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}} x", 2, "bytes after the header");
  refused("{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
          "\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}", 2, "stored twice");
  refused("[1, 2]", 0, "not a JSON object");
}

Test(safetensors, header_length_checked) {
  unsigned char b[16] = {0};
  qc_st *st = NULL;
  uint64_t n = QC_ST_MAX_HEADER + 1;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  qc_err_clear();
  cr_expect_eq(qc_st_parse(b, sizeof b, "big", &st), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "over the 100 MB limit") != NULL, "%s", qc_err_msg());
  n = 9; /* 8 + 9 > 16 */
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  qc_err_clear();
  cr_expect_eq(qc_st_parse(b, sizeof b, "short", &st), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "does not fit the file") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_st_parse(b, 5, "tiny", &st), QC_EINPUT);
  qc_err_clear();
}

/* The file read by pread (default) or mmap (QATCHECK_ST_READ=mmap). */
static void file_reads(const char *how) {
  const char *hdr = "{\"x\": {\"dtype\": \"U8\", \"shape\": [3, 5000], \"data_offsets\": [0, 15000]},"
                    "\"y\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [15000, 15008]}}";
  size_t len;
  unsigned char *img = image(hdr, 15008, &len);
  char path[] = "/tmp/qc_st_testXXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, img, len), (ssize_t)len);
  close(fd);
  qc_st *st;
  if (how) setenv("QATCHECK_ST_READ", how, 1);
  cr_assert_eq(qc_st_open(path, &st), QC_OK, "%s", qc_err_msg());
  unsetenv("QATCHECK_ST_READ");
  unsigned char buf[5000];
  cr_assert_eq(qc_st_read(st, qc_st_find(st, "x"), 1, buf, 5000), QC_OK, "%s", qc_err_msg());
  size_t h = strlen(hdr);
  cr_expect_eq(memcmp(buf, img + 8 + h + 5000, 5000), 0, "slice 1 as stored");
  qc_tensor t;
  cr_assert_eq(qc_st_load(st, "y", NULL, &t), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(memcmp(t.data, img + 8 + h + 15000, 8), 0);
  qc_tensor_free(&t);
  /* a file that shrinks after it was opened is refused, not a SIGBUS */
  cr_assert_eq(truncate(path, (off_t)(len - 100)), 0);
  qc_err_clear();
  cr_expect_eq(qc_st_read(st, qc_st_find(st, "x"), 2, buf, 5000), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "shorter than when it was opened") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  qc_st_close(st);
  unlink(path);
  free(img);
}

Test(safetensors, file_reads_by_pread) { file_reads(NULL); }
Test(safetensors, file_reads_by_mmap) { file_reads("mmap"); }
