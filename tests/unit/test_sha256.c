/* test_sha256.c: SHA-256 against the FIPS 180-4 examples, on the portable
 * code and on the x86 SHA extensions (where the CPU has them), and the two
 * against each other on random data fed in random pieces. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"

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
