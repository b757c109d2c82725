/* test_dump.c: every element type of the dump schema round-trips; modules
 * are found by regex; schema errors name the dataset. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/dump.h"
#include "core/qc.h"

static char g_path[256];

static void tmpfile_path(void) {
  snprintf(g_path, sizeof g_path, "/tmp/qc_test_dump_%d.h5", (int)getpid());
}

Test(dump, every_dtype_roundtrips) {
  tmpfile_path();
  qc_dump *d;
  cr_assert_eq(qc_dump_create(g_path, &d), QC_OK, "%s", qc_err_msg());
  qc_dtype all[] = {QC_F64, QC_F32, QC_F16, QC_BF16, QC_I32, QC_I64, QC_U8, QC_E4M3, QC_E5M2, QC_E8M0, QC_E2M1X2};
  int n = (int)(sizeof all / sizeof all[0]);
  for (int i = 0; i < n; i++) {
    qc_tensor t;
    int64_t shape[2] = {3, 5};
    cr_assert_eq(qc_tensor_alloc(&t, "t", all[i], 2, shape), QC_OK);
    for (size_t b = 0; b < t.nbytes; b++) ((uint8_t *)t.data)[b] = (uint8_t)(b * 37 + i);
    if (all[i] == QC_F64 || all[i] == QC_F32 || all[i] == QC_F16) /* keep float patterns finite and plain */
      for (int64_t e = 0; e < 15; e++) {
        if (all[i] == QC_F64) ((double *)t.data)[e] = e * 0.25 - 1;
        if (all[i] == QC_F32) ((float *)t.data)[e] = (float)e * 0.5f - 3;
        if (all[i] == QC_F16) ((uint16_t *)t.data)[e] = (uint16_t)(0x3c00 + e);
      }
    char name[64];
    snprintf(name, sizeof name, "/m/inputs/%s", qc_dtype_name(all[i]));
    cr_assert_eq(qc_dump_write(d, name, &t), QC_OK, "%s", qc_err_msg());
    qc_tensor_free(&t);
  }
  cr_assert_eq(qc_dump_set_attr(d, "/m", "class", "linear"), QC_OK);
  qc_dump_close(d);

  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "/m/inputs/%s", qc_dtype_name(all[i]));
    qc_tensor t;
    cr_assert_eq(qc_dump_read(d, name, &t), QC_OK, "%s", qc_err_msg());
    cr_expect_eq(t.dtype, all[i], "%s read back as %s", qc_dtype_name(all[i]), qc_dtype_name(t.dtype));
    cr_expect_eq(t.ndim, 2);
    cr_expect_eq(t.shape[1], 5);
    for (size_t b = 0; b < t.nbytes && all[i] != QC_F64 && all[i] != QC_F32 && all[i] != QC_F16; b++)
      cr_assert_eq(((uint8_t *)t.data)[b], (uint8_t)(b * 37 + i));
    if (all[i] == QC_F16) cr_expect_eq(((uint16_t *)t.data)[3], 0x3c03);
    if (all[i] == QC_F32) cr_expect_eq(((float *)t.data)[3], -1.5f);
    qc_tensor_free(&t);
  }
  qc_dump_entry *e;
  int ne;
  cr_assert_eq(qc_dump_modules(d, "^/m$", &e, &ne), QC_OK);
  cr_expect_eq(ne, 1);
  cr_expect_str_eq(e[0].cls, "linear");
  free(e);
  cr_assert_eq(qc_dump_modules(d, "nomatch", &e, &ne), QC_OK);
  cr_expect_eq(ne, 0);
  free(e);
  qc_err_clear();
  qc_tensor t;
  cr_expect_eq(qc_dump_read(d, "/m/inputs/nothere", &t), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "'/m/inputs/nothere'") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_dump_modules(d, "(", &e, &ne), QC_EINPUT);
  qc_err_clear();
  qc_dump_close(d);
  unlink(g_path);
}

Test(dump, slice_reads_one_expert) {
  tmpfile_path();
  qc_dump *d;
  cr_assert_eq(qc_dump_create(g_path, &d), QC_OK);
  qc_tensor t;
  int64_t shape[3] = {4, 2, 3};
  cr_assert_eq(qc_tensor_alloc(&t, "w", QC_F32, 3, shape), QC_OK);
  for (int i = 0; i < 24; i++) ((float *)t.data)[i] = (float)i;
  cr_assert_eq(qc_dump_write(d, "/e/params/weight", &t), QC_OK);
  qc_tensor_free(&t);
  qc_dump_close(d);
  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK);
  cr_assert_eq(qc_dump_read_slice(d, "/e/params/weight", 2, &t), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(t.ndim, 2);
  cr_expect_eq(((float *)t.data)[0], 12.0f);
  cr_expect_eq(((float *)t.data)[5], 17.0f);
  qc_tensor_free(&t);
  cr_expect_eq(qc_dump_read_slice(d, "/e/params/weight", 4, &t), QC_EINPUT);
  qc_err_clear();
  qc_dump_close(d);
  unlink(g_path);
}

/* A string attribute is read whole (a tie's sites grow with the tie), and a
 * field too short for one refuses it naming it: a value is never cut. */
Test(dump, attributes_whole_never_cut) {
  tmpfile_path();
  qc_dump *d;
  char big[6001], buf[4096];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  cr_assert_eq(qc_dump_create(g_path, &d), QC_OK);
  cr_assert_eq(qc_dump_set_attr(d, "/g", "sites", big), QC_OK);
  cr_assert_eq(qc_dump_set_attr(d, "/g", "short", "ok"), QC_OK);
  qc_dump_close(d);
  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK, "%s", qc_err_msg());
  const char *s = qc_dump_attr_text(d, "/g", "sites");
  cr_assert(s && strcmp(s, big) == 0, "the attribute read whole");
  cr_expect_null(qc_dump_attr_text(d, "/g", "absent"));
  qc_err_clear();
  cr_expect_eq(qc_dump_get_attr(d, "/g", "sites", buf, sizeof buf), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "attribute 'sites' is 6000 bytes, longer than the 4095") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_dump_get_attr(d, "/g", "short", buf, sizeof buf), QC_OK);
  cr_expect_str_eq(buf, "ok");
  cr_expect_eq(qc_dump_get_attr(d, "/g", "absent", buf, sizeof buf), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "", "an absent attribute sets no message");
  qc_dump_close(d);
  unlink(g_path);
}

Test(dump, not_a_dump) {
  tmpfile_path();
  FILE *f = fopen(g_path, "wb");
  fputs("not hdf5", f);
  fclose(f);
  qc_dump *d;
  cr_expect_eq(qc_dump_open(g_path, &d), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "not an HDF5 file") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_dump_open("/nonexistent/x.h5", &d), QC_EINPUT);
  qc_err_clear();
  unlink(g_path);
}

/* qc_dump_pread and qc_dump_read_into give qc_dump_read's bytes, whole and
 * per slice, for every element type; a chunked dataset and a file with a
 * userblock are not located for direct reads (offset -1) but still read. */
#include <hdf5.h>
static void check_direct(qc_dump *d, const char *dset, long long index, int want_direct) {
  qc_tensor t;
  qc_dump_loc loc;
  qc_err_clear();
  int rc = index >= 0 ? qc_dump_read_slice(d, dset, index, &t) : qc_dump_read(d, dset, &t);
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_dump_locate(d, dset, index, &loc), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(loc.dtype, t.dtype, "%s", dset);
  cr_assert_eq(loc.nbytes, t.nbytes, "%s", dset);
  cr_assert_eq(loc.offset >= 0, want_direct, "%s [%lld]: offset %lld", dset, index, loc.offset);
  uint8_t *buf = malloc(t.nbytes + 1);
  cr_assert(buf);
  cr_assert_eq(qc_dump_read_into(d, dset, index, buf, t.nbytes), QC_OK, "%s", qc_err_msg());
  cr_assert(memcmp(buf, t.data, t.nbytes) == 0, "%s [%lld]: read_into differs", dset, index);
  cr_assert_eq(qc_dump_read_into(d, dset, index, buf, t.nbytes + 1), QC_EINPUT, "a wrong size must be refused");
  if (want_direct) {
    memset(buf, 0xa5, t.nbytes);
    cr_assert_eq(qc_dump_pread(d, dset, &loc, buf), QC_OK, "%s", qc_err_msg());
    cr_assert(memcmp(buf, t.data, t.nbytes) == 0, "%s [%lld]: pread differs", dset, index);
  }
  free(buf);
  qc_tensor_free(&t);
}

Test(dump, direct_reads_match_hdf5) {
  tmpfile_path();
  qc_dump *d;
  cr_assert_eq(qc_dump_create(g_path, &d), QC_OK, "%s", qc_err_msg());
  qc_dtype all[] = {QC_F64, QC_F32, QC_F16, QC_BF16, QC_U8, QC_E4M3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    qc_tensor t;
    int64_t shape[3] = {3, 4, 6};
    cr_assert_eq(qc_tensor_alloc(&t, "t", all[i], 3, shape), QC_OK);
    for (size_t b = 0; b < t.nbytes; b++) ((uint8_t *)t.data)[b] = (uint8_t)(b * 29 + i);
    char name[64];
    snprintf(name, sizeof name, "/m/params/%s", qc_dtype_name(all[i]));
    cr_assert_eq(qc_dump_write(d, name, &t), QC_OK, "%s", qc_err_msg());
    qc_tensor_free(&t);
  }
  qc_dump_close(d);
  /* a chunked dataset beside them, through the HDF5 API */
  hid_t f = H5Fopen(g_path, H5F_ACC_RDWR, H5P_DEFAULT);
  hsize_t dims[2] = {8, 8}, chunk[2] = {4, 4};
  hid_t sp = H5Screate_simple(2, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(pl, 2, chunk);
  hid_t ds = H5Dcreate2(f, "/m/params/chunked", H5T_NATIVE_FLOAT, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)i * 0.5f;
  cr_assert(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Dclose(ds); H5Pclose(pl); H5Sclose(sp); H5Fclose(f);

  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK, "%s", qc_err_msg());
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "/m/params/%s", qc_dtype_name(all[i]));
    check_direct(d, name, -1, 1);
    check_direct(d, name, 0, 1);
    check_direct(d, name, 2, 1);
  }
  check_direct(d, "/m/params/chunked", -1, 0);
  check_direct(d, "/m/params/chunked", 3, 0);
  qc_dump_loc loc;
  cr_assert_eq(qc_dump_locate(d, "/m/params/float32", 3, &loc), QC_EINPUT, "slice 3 of [3, ...] is out of range");
  qc_dump_close(d);
  unlink(g_path);

  /* a userblock shifts HDF5's addresses: no direct reads there */
  hid_t fc = H5Pcreate(H5P_FILE_CREATE);
  H5Pset_userblock(fc, 512);
  f = H5Fcreate(g_path, H5F_ACC_TRUNC, fc, H5P_DEFAULT);
  long long one = 1;
  hid_t asp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, "qatcheck_dump", H5T_STD_I64LE, asp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_LLONG, &one);
  H5Aclose(a); H5Sclose(asp);
  sp = H5Screate_simple(2, dims, NULL);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  ds = H5Dcreate2(f, "/u/params/weight", H5T_NATIVE_FLOAT, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  cr_assert(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Dclose(ds); H5Sclose(sp); H5Pclose(lcpl); H5Fclose(f); H5Pclose(fc);
  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK, "%s", qc_err_msg());
  check_direct(d, "/u/params/weight", -1, 0);
  qc_dump_close(d);
  unlink(g_path);
}

/* A direct read of 50 MB is split into pieces on threads: the same bytes
 * as HDF5's own read, on 1 and 3 threads; a file cut short after it was
 * opened is an error naming the dataset (the last piece meets the end),
 * not a partial buffer. */
Test(dump, large_direct_read_in_pieces) {
  tmpfile_path();
  qc_dump *d;
  cr_assert_eq(qc_dump_create(g_path, &d), QC_OK, "%s", qc_err_msg());
  qc_tensor t;
  int64_t shape[2] = {5, 2621440}; /* 5 x 10 MiB of float32 */
  cr_assert_eq(qc_tensor_alloc(&t, "w", QC_F32, 2, shape), QC_OK);
  for (size_t b = 0; b < t.nbytes; b++) ((uint8_t *)t.data)[b] = (uint8_t)(b * 131 + (b >> 20));
  cr_assert_eq(qc_dump_write(d, "/m/params/weight", &t), QC_OK, "%s", qc_err_msg());
  qc_dump_close(d);
  cr_assert_eq(qc_dump_open(g_path, &d), QC_OK, "%s", qc_err_msg());
  for (int th = 0; th < 2; th++) {
    setenv("QATCHECK_THREADS", th ? "3" : "1", 1);
    check_direct(d, "/m/params/weight", -1, 1);
  }
  unsetenv("QATCHECK_THREADS");
  qc_dump_loc loc;
  cr_assert_eq(qc_dump_locate(d, "/m/params/weight", -1, &loc), QC_OK, "%s", qc_err_msg());
  cr_assert(loc.offset >= 0);
  cr_assert_eq(truncate(g_path, (off_t)(loc.offset + (long long)loc.nbytes - 4096)), 0);
  void *buf = malloc(loc.nbytes);
  cr_assert(buf);
  qc_err_clear(); /* check_direct left its planted wrong-size refusal: first message wins */
  cr_expect_eq(qc_dump_pread(d, "/m/params/weight", &loc, buf), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "'/m/params/weight': the file ends early") != NULL, "%s", qc_err_msg());
  free(buf);
  qc_dump_close(d);
  qc_tensor_free(&t);
  unlink(g_path);
}
