/* test_robust.c: bad input that once crashed, hung or ran wrongly: numbers
 * out of range in a case, non-finite bounds, weak tolerance sets (the
 * lint), special files, the watchdog's argument, a user's regex, and the
 * class table's list of gradients against what each reference returns. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/file.h"
#include "core/pattern.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "engine/gen.h"
#include "model/case.h"
#include "model/modinfo.h"

#define TOL "\"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"reasoning\": \"bf16\"}}"
#define GEN_SEED(s) "\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[2, 3, 4]], \"seed\": " s "}}"

static int parse(const char *text, qc_case *c) {
  qc_err_clear();
  return qc_case_parse(text, "t.json", "/cases", c);
}

Test(robust, numbers_range_checked_before_conversion) {
  static qc_case c;
  struct { const char *text, *want; } bad[] = {
      {"{" GEN_SEED("1e300") ", " TOL "}", "key 'seed'"},
      {"{" GEN_SEED("1e999") ", " TOL "}", "not finite"},
      {"{" GEN_SEED("18446744073709551616") ", " TOL "}", "key 'seed'"},
      {"{" GEN_SEED("9007199254740994") ", " TOL "}", "2^53"},
      {"{" GEN_SEED("-1") ", " TOL "}", "key 'seed'"},
      {"{" GEN_SEED("0") ", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"norm_ratio\": [-1e999, 1e999], \"reasoning\": \"r\"}}}",
       "expected finite bounds"},
      {"{" GEN_SEED("0") ", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e999, \"reasoning\": \"r\"}}}", "finite number"},
      {"{" GEN_SEED("0") ", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"noise_multiple\": -1, \"reasoning\": \"r\"}}}",
       "'noise_multiple'"},
      {"{" GEN_SEED("0") ", \"contract\": {\"rounding\": {\"sr\": {\"seed\": 1e300}}}, " TOL "}", "seed"},
      {"{" GEN_SEED("0") ", \"contract\": {\"rounding\": {\"sr\": {\"seed\": 2.5}}}, " TOL "}", "seed"},
      {"{" GEN_SEED("0") ", \"contract\": {\"ste\": {\"clipped\": 1e999}}, " TOL "}", "contract key 'ste'"},
      {"{" GEN_SEED("0") ", \"contract\": {\"rotary_dim\": -1e300}, " TOL "}", "contract key 'rotary_dim'"},
      {"{\"module\": \"linaer\", \"data\": {\"generate\": {\"shapes\": [[1, 2, 3]]}}, " TOL "}", "class 'linaer' is not known"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = parse(bad[i].text, &c);
    cr_expect_eq(rc, QC_EINPUT, "case %zu accepted: %s", i, bad[i].text);
    cr_expect(strstr(qc_err_msg(), bad[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, qc_err_msg(), bad[i].want);
  }
  cr_assert_eq(parse("{" GEN_SEED("9007199254740992") ", " TOL "}", &c), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(c.seed, 9007199254740992ull);
  cr_assert_eq(parse("{" GEN_SEED("0") ", \"contract\": {\"rounding\": {\"sr\": {\"seed\": 12}}}, " TOL "}", &c), QC_OK, "%s",
               qc_err_msg());
  qc_err_clear();
}

/* The lint: which planted error (2 g, g / 2, -g) each tolerance set passes. */
Test(robust, weak_tolerances_named) {
  static qc_case c;
  struct { const char *tol; int weak; const char *want; } t[] = {
      {"\"cosine_min\": 0.999", 1, "scale error (it passes 2 g and g / 2)"},
      {"\"norm_ratio\": [0.99, 1.01]", 1, "sign flip"},
      {"\"rel_l2\": 0.8", 1, "passes g / 2"},
      {"\"rel_l2\": 3", 1, "sign flip"},
      {"\"norm_ratio\": [0.1, 1.5], \"cosine_min\": 0.9", 1, "passes g / 2"},
      {"\"cosine_min\": -1, \"norm_ratio\": [0.9, 1.1]", 1, "sign flip"},
      {"\"rel_l2\": 0.01", 0, ""},
      {"\"norm_ratio\": [0.9, 1.1], \"cosine_min\": 0.99", 0, ""},
      {"\"cosine_min\": 0.99, \"max_abs\": 1e-3", 0, ""},
      {"\"noise_multiple\": 1.5", 0, ""},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    char text[512];
    snprintf(text, sizeof text, "{" GEN_SEED("0") ", \"tolerances\": {\"d_x\": {%s, \"reasoning\": \"r\"}}}", t[i].tol);
    cr_assert_eq(parse(text, &c), QC_OK, "%s: %s", t[i].tol, qc_err_msg());
    cr_expect_eq(c.nweak, t[i].weak, "%s: %d weak", t[i].tol, c.nweak);
    cr_expect_eq(qc_case_weak(&c, 0), t[i].weak ? QC_EINPUT : QC_OK, "%s", t[i].tol);
    if (t[i].weak) {
      cr_expect(strstr(qc_err_msg(), "tolerances.d_x cannot see") != NULL, "%s: %s", t[i].tol, qc_err_msg());
      cr_expect(strstr(qc_err_msg(), t[i].want) != NULL, "%s: '%s' lacks '%s'", t[i].tol, qc_err_msg(), t[i].want);
      cr_expect(strstr(qc_err_hint(), "--allow-weak-tolerances") != NULL, "%s", qc_err_hint());
    }
    qc_err_clear();
  }
}

Test(robust, special_files_refused_unopened) {
  char dir[] = "/tmp/qc_robust_XXXXXX";
  cr_assert(mkdtemp(dir));
  char fifo[64], big[64];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(big, sizeof big, "%s/big", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  static qc_case c;
  qc_err_clear();
  cr_expect_eq(qc_case_load(fifo, &c), QC_EINPUT); /* would block in fopen before */
  cr_expect(strstr(qc_err_msg(), "a FIFO") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_case_load(dir, &c), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "a directory") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_case_load("/dev/zero", &c), QC_EINPUT); /* would never end */
  cr_expect(strstr(qc_err_msg(), "character device") != NULL, "%s", qc_err_msg());
  FILE *f = fopen(big, "w");
  cr_assert(f);
  fputs("0123456789", f);
  fclose(f);
  char *buf;
  size_t n;
  qc_err_clear();
  cr_expect_eq(qc_read_file(big, "log", 9, &buf, &n), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "limit of 9 bytes") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_assert_eq(qc_read_file(big, "log", 10, &buf, &n), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(n, 10u);
  cr_expect_str_eq(buf, "0123456789");
  free(buf);
  unlink(big);
  unlink(fifo);
  rmdir(dir);
}

/* A user's regex (--modules, a dump's module filter): compiled, or refused
 * with one message naming where it came from and the pattern. */
Test(robust, user_regex_compiled_or_named) {
  regex_t re;
  qc_err_clear();
  cr_assert_eq(qc_pattern_compile(&re, "^/layers\\.[0-9]+$", "--modules"), QC_OK);
  cr_expect_eq(regexec(&re, "/layers.12", 0, NULL, 0), 0);
  cr_expect_neq(regexec(&re, "/layers.x", 0, NULL, 0), 0);
  regfree(&re);
  cr_expect_eq(qc_pattern_compile(&re, "(", "--modules"), QC_EINPUT);
  cr_expect(strncmp(qc_err_msg(), "--modules '(': ", 15) == 0, "message: %s", qc_err_msg());
  qc_err_clear();
}

Test(robust, watchdog_argument) {
  qc_err_clear();
  cr_expect_eq(qc_watchdog_arm(-1), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "--timeout") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_watchdog_arm(1.0 / 0.0), QC_EINPUT);
  qc_err_clear();
  cr_expect_eq(qc_watchdog_arm(3600), QC_OK);
  cr_expect_eq(qc_watchdog_arm(0), QC_OK); /* off again */
}

/* Every coverage item a class row names is an item of the list that only
 * some classes can show (a typo would never apply), named once. */
Test(robust, class_coverage_items_are_known) {
  int n;
  const qc_registry_row *rows = qc_registry_rows(&n);
  for (int i = 0; i < n; i++)
    for (const qc_class_cov *k = rows[i].cls->coverage; k && k->item; k++) {
      int c = qc_cov_find(k->item);
      cr_expect(c >= 0 && qc_coverage[c].per_class, "class %s names coverage item '%s': not a per-class item",
                rows[i].cls->name, k->item);
      for (const qc_class_cov *j = k + 1; j->item; j++)
        cr_expect(strcmp(j->item, k->item) != 0, "class %s names item '%s' twice", rows[i].cls->name, k->item);
    }
}

/* Every class's reference returns only gradients its `grads` list names
 * (the list refuses tolerance typos, so it must not miss a real one). */
Test(robust, class_grads_list_what_the_reference_returns) {
  int n;
  const qc_registry_row *rows = qc_registry_rows(&n);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  static const char kinds[1][QC_NAMELEN] = {"random"};
  for (int i = 0; i < n; i++) {
    const qc_class *cls = rows[i].cls;
    cr_assert(cls->grads && cls->grads[0], "class %s has no grads list", cls->name);
    int64_t shape[QC_MAXDIM];
    int ns = 0;
    const char *spec = cls->fd_shape ? cls->fd_shape : "6,8,5";
    for (const char *p = spec; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] ? 1 : 0)) shape[ns++] = atoll(p);
    qc_module m;
    memset(&m, 0, sizeof m);
    m.cls = cls;
    snprintf(m.path, sizeof m.path, "%s", cls->name);
    if (strcmp(cls->name, "ssd") == 0) {
      qc_contract_set(&m.contract, "initial_state", "true", 0, 0);
      qc_contract_set(&m.contract, "d_skip", "true", 0, 0);
    }
    qc_err_clear();
    cr_assert_eq(qc_contract_validate(&m.contract, cls->keys, cls->name), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(qc_gen_module(&rows[i], ns, shape, 1, 0, "normal", kinds, 1, &m), QC_OK, "%s: %s", cls->name, qc_err_msg());
    /* what a class generates, it declares (a dump holding the same is accepted) */
    cr_assert(cls->tensors && cls->tensors[0], "class %s declares no tensors", cls->name);
    cr_expect_eq(qc_module_check_known(&m, cls->name), QC_OK, "%s", qc_err_msg());
    qc_err_clear();
    qc_tset ref = {0};
    cr_assert_eq(rows[i].reference(&ctx, &m, &m.grad_out.t[0], &ref), QC_OK, "%s: %s", cls->name, qc_err_msg());
    cr_expect(ref.n > 0, "%s: no gradient", cls->name);
    for (int j = 0; j < ref.n; j++) {
      char word[QC_NAMELEN + 2];
      snprintf(word, sizeof word, " %s ", ref.t[j].name);
      char list[256];
      snprintf(list, sizeof list, " %s ", cls->grads);
      cr_expect(strstr(list, word) != NULL, "class %s returns '%s', missing from its grads \"%s\"", cls->name, ref.t[j].name,
                cls->grads);
      char in[QC_NAMELEN + 16], pa[QC_NAMELEN + 16], decl[1024];
      snprintf(in, sizeof in, " inputs/%s ", ref.t[j].name + 2);
      snprintf(pa, sizeof pa, " params/%s ", ref.t[j].name + 2);
      snprintf(decl, sizeof decl, " %s ", cls->tensors);
      cr_expect(strstr(decl, in) || strstr(decl, pa), "class %s returns '%s' of a tensor its tensors \"%s\" lack", cls->name,
                ref.t[j].name, cls->tensors);
    }
    qc_tset_free(&ref);
    qc_module_free(&m);
  }
}
