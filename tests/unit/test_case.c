/* test_case.c: case-file validation, each error on its own. */
#include <criterion/criterion.h>
#include <string.h>

#include "model/case.h"
#include "core/qc.h"

#define TOL "\"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"reasoning\": \"bf16\"}}"
#define GEN "\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[2, 3, 4]], \"seed\": 7}}"

static int parse(const char *text, qc_case *c) {
  qc_err_clear();
  return qc_case_parse(text, "t.json", "/cases", c);
}

Test(case_file, valid_generate_and_dump) {
  qc_case c;
  cr_assert_eq(parse("{" GEN ", \"dy\": [\"random\", \"zero\"], " TOL "}", &c), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(c.data, QC_DATA_GENERATE);
  cr_expect_eq(c.nshapes, 1);
  cr_expect_eq(c.shapes[0][2], 4);
  cr_expect_eq(c.seed, 7u);
  cr_expect_eq(c.ndy, 2);
  cr_expect_str_eq(c.name, "t");
  cr_assert_eq(parse("{\"data\": {\"dump\": \"d/x.h5\", \"modules\": \"mlp\"}, \"candidate\": \"dump\", " TOL "}", &c), QC_OK,
               "%s", qc_err_msg());
  cr_expect_str_eq(c.dump, "/cases/d/x.h5"); /* relative to the case's folder */
  cr_expect_str_eq(c.modules_re, "mlp");
  cr_expect_eq(c.cand, QC_CAND_DUMP);
  cr_assert_eq(parse("{" GEN ", \"contract\": {\"ste\": {\"clipped\": 3.5}, \"rounding\": {\"sr\": {\"seed\": 9}}}, "
                     "\"candidate\": {\"plugin\": \"p.so\", \"symbol\": \"f\"}, " TOL "}", &c),
               QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(qc_contract_str(&c.contract, "ste", ""), "clipped");
  cr_expect_eq(qc_contract_num(&c.contract, "ste", 0), 3.5);
  cr_expect_eq(qc_contract_num(&c.contract, "rounding", 0), 9);
  cr_expect_str_eq(c.plugin, "/cases/p.so");
}

Test(case_file, each_error) {
  qc_case c;
  struct { const char *text, *want; } bad[] = {
      {"{" GEN, "malformed JSON"},
      {"[1]", "expected a JSON object"},
      {"{" GEN ", \"extra\": 1, " TOL "}", "unknown key 'extra'"},
      {"{" GEN "}", "'tolerances' is missing"},
      {"{" GEN ", \"tolerances\": {}}", "non-empty object"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3}}}", "'reasoning' is missing"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"reasoning\": \"\"}}}", "'reasoning' is empty"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"reasoning\": \"r\"}}}", "declares no bound"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"rel_l2\": \"small\", \"reasoning\": \"r\"}}}", "expected a finite number"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"cosine_min\": 2, \"reasoning\": \"r\"}}}", "cosine_min"},
      {"{" GEN ", \"tolerances\": {\"d_x\": {\"norm_ratio\": [1], \"reasoning\": \"r\"}}}", "expected [low, high]"},
      {"{\"module\": \"linear\", " TOL "}", "'data' is missing"},
      {"{\"data\": {\"generate\": {\"shapes\": [[1, 2, 3]]}}, " TOL "}", "needs a module class"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": []}}, " TOL "}", "non-empty array of shapes"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1, -2, 3]]}}, " TOL "}", "non-negative integer"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1, 2.5, 3]]}}, " TOL "}", "non-negative integer"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1, 2, 3]], \"sizes\": 1}}, " TOL "}", "unknown key 'sizes'"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1, 2, 3]], \"values\": \"wild\"}}, " TOL "}", "'values'"},
      {"{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1,2,3]]}, \"dump\": \"x.h5\"}, " TOL "}", "not both"},
      {"{" GEN ", \"candidate\": \"dump\", " TOL "}", "needs data from a dump"},
      {"{" GEN ", \"candidate\": \"mine\", " TOL "}", "key 'candidate'"},
      {"{" GEN ", \"candidate\": {\"plugin\": \"p.so\"}, " TOL "}", "\"symbol\""},
      {"{" GEN ", \"dy\": [], " TOL "}", "empty list"},
      {"{" GEN ", \"dy\": [\"random\", \"random\"], " TOL "}", "listed twice"},
      {"{" GEN ", \"contract\": {\"ste\": [1, 2]}, " TOL "}", "contract key 'ste'"},
      {"{" GEN ", \"module\": 3, " TOL "}", "duplicate key 'module'"},
      {"{\"module\": 3, \"data\": {\"generate\": {\"shapes\": [[1, 2, 3]]}}, " TOL "}", "key 'module': expected a string"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = parse(bad[i].text, &c);
    cr_expect_eq(rc, QC_EINPUT, "case %zu accepted: %s", i, bad[i].text);
    cr_expect(strstr(qc_err_msg(), bad[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, qc_err_msg(), bad[i].want);
  }
  qc_err_clear();
}
