/* test_sha256.c: SHA-256 against the FIPS 180-4 examples, on the portable
 * code and on the x86 SHA extensions (where the CPU has them), and the two
 * against each other on random data fed in random pieces; a report's
 * inputs: a small file's SHA-256, a large one's SHA-256 tree. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/sha256.h"
#include "report/prov.h"

static const struct {
  const char *msg;
  const char *hex;
} kat[] = {
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
};

/* The examples and a million 'a' under accel (0: portable, 1: SHA-NI). */
static void check_kat(int accel) {
  char out[65];
  for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
    qc_sha256_hex(kat[i].msg, strlen(kat[i].msg), out);
    cr_expect_str_eq(out, kat[i].hex, "accel %d, message %zu", accel, i);
  }
  qc_sha256 c;
  qc_sha256_init(&c);
  char a[1000];
  memset(a, 'a', sizeof a);
  for (int i = 0; i < 1000; i++) qc_sha256_update(&c, a, sizeof a);
  qc_sha256_final_hex(&c, out);
  cr_expect_str_eq(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "accel %d, a million 'a'", accel);
}

Test(sha256, fips_examples_portable) {
  qc_sha256_accel(0);
  cr_assert_eq(qc_sha256_accel(-1), 0);
  check_kat(0);
  qc_sha256_accel(1);
}

Test(sha256, fips_examples_sha_ni) {
  if (!qc_sha256_accel(1)) cr_skip_test("this CPU has no SHA extensions");
  check_kat(1);
}

/* Every length 0..300 and a 100 kB buffer in random pieces: the two
 * implementations give the same digest. */
Test(sha256, sha_ni_matches_portable) {
  if (!qc_sha256_accel(1)) cr_skip_test("this CPU has no SHA extensions");
  enum { N = 100000 };
  unsigned char *buf = malloc(N);
  cr_assert(buf);
  unsigned s = 12345;
  for (int i = 0; i < N; i++) buf[i] = (unsigned char)((s = s * 1103515245u + 12345u) >> 16);
  char d0[65], d1[65];
  for (size_t n = 0; n <= 300; n++) {
    qc_sha256_accel(0);
    qc_sha256_hex(buf + n, n, d0);
    qc_sha256_accel(1);
    qc_sha256_hex(buf + n, n, d1);
    cr_expect_str_eq(d1, d0, "length %zu", n);
  }
  for (int accel = 0; accel < 2; accel++) {
    qc_sha256_accel(accel);
    qc_sha256 c;
    qc_sha256_init(&c);
    unsigned r = 7;
    for (size_t at = 0; at < N;) {
      size_t k = (r = r * 1103515245u + 12345u) >> 16 & 511;
      if (k > N - at) k = N - at;
      qc_sha256_update(&c, buf + at, k);
      at += k;
    }
    qc_sha256_final_hex(&c, accel ? d1 : d0);
  }
  cr_expect_str_eq(d1, d0, "100 kB in random pieces");
  qc_sha256_accel(1);
  free(buf);
}

/* A report's inputs: a file of at most 64 MiB by its SHA-256, a larger one
 * by its SHA-256 tree (the digest of its 64 MiB pieces' digests, in file
 * order), here computed piece by piece on one thread: the threads'
 * digests land in their pieces' places. The large file is sparse, with a
 * different byte near each piece's start and end and a 5-byte last piece. */
Test(sha256, report_inputs_whole_and_tree) {
  const long long P = (long long)64 << 20, n = 3 * P + 5;
  char big[] = "/tmp/qc_test_tree_XXXXXX", small[] = "/tmp/qc_test_small_XXXXXX";
  int fb = mkstemp(big), fs = mkstemp(small);
  cr_assert(fb >= 0 && fs >= 0);
  cr_assert_eq(ftruncate(fb, n), 0);
  for (long long i = 0; i < 4; i++) {
    unsigned char v[2] = {(unsigned char)(i + 1), (unsigned char)(7 * i + 3)};
    cr_assert_eq(pwrite(fb, &v[0], 1, i * P + 1), 1);
    cr_assert_eq(pwrite(fb, &v[1], 1, i * P + (i < 3 ? P - 2 : 3)), 1);
  }
  cr_assert_eq(write(fs, "abc", 3), 3);
  /* the expected tree: each piece hashed alone, the digests hashed in order */
  unsigned char *buf = malloc((size_t)P), dig[4][32];
  cr_assert(buf);
  for (long long i = 0; i < 4; i++) {
    const long long len = i < 3 ? P : 5;
    cr_assert_eq(pread(fb, buf, (size_t)len, i * P), len);
    qc_sha256 c;
    qc_sha256_init(&c);
    qc_sha256_update(&c, buf, (size_t)len);
    qc_sha256_final(&c, dig[i]);
  }
  free(buf);
  char want[65];
  qc_sha256_hex(dig, sizeof dig, want);
  qc_prov p;
  char *argv[] = {"vjp"};
  qc_prov_init(&p, 1, argv);
  struct stat sb, ss;
  cr_assert(fstat(fb, &sb) == 0 && fstat(fs, &ss) == 0);
  cr_assert_eq(qc_prov_add(&p, "dump", big, (long long)sb.st_size, sb.st_dev, sb.st_ino), 0);
  cr_assert_eq(qc_prov_add(&p, "case", small, (long long)ss.st_size, ss.st_dev, ss.st_ino), 0);
  cJSON *root = cJSON_CreateObject();
  qc_prov_json(&p, root);
  const cJSON *ins = cJSON_GetObjectItem(root, "inputs"), *d = cJSON_GetArrayItem(ins, 0), *c = cJSON_GetArrayItem(ins, 1);
  cr_assert(d && c);
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(d, "sha256_tree")), want, "the large file's tree");
  cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(d, "tree_piece")), 67108864.0);
  cr_expect(!cJSON_GetObjectItem(d, "sha256"), "a tree is not reported as the file's SHA-256");
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(c, "sha256")),
                   "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "the small file's SHA-256");
  cJSON_Delete(root);
  qc_prov_free(&p);
  close(fb);
  close(fs);
  unlink(big);
  unlink(small);
}
