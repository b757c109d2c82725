/* contract.h: a module's gradient contract, as declared in a case file or a
 * dump's `contract` attribute: a flat map of keys to values. A value is a
 * string ("dequant"), a number, or a one-key object flattened to its key plus
 * an optional number ({"clipped": 3} -> str "clipped", num 3;
 * {"sr": {"seed": 5}} -> str "sr", num 5). Each class declares the keys it
 * takes (qc_key_spec); the plan validates against them, so modules and
 * references only read. */
#ifndef QC_CONTRACT_H
#define QC_CONTRACT_H

#include "numerics/sr.h"

#define QC_MAX_KV 32

typedef struct qc_kv {
  char key[48];
  char str[160];  /* "" for a plain number (long enough for a parameter identity, sr_salt) */
  double num;
  int has_num;
} qc_kv;

typedef struct qc_contract {
  int n;
  qc_kv kv[QC_MAX_KV];
} qc_contract;

/* A key spec's `values` for a free string (an identity, a name). */
#define QC_KEY_STRING "*"

/* What a class accepts for one contract key. */
typedef struct qc_key_spec {
  const char *key;
  const char *values;  /* "a|b|c": allowed strings; NULL: a number; "a|b|{c}": c takes a number;
                        * QC_KEY_STRING: any non-empty string */
  const char *dflt;    /* default as the string form ("none", "identity", "1e-6") */
  const char *help;    /* one line for --help (docs/classes.md has the table) */
} qc_key_spec;

/* Lookups return the declared default when the key is absent. */
const char *qc_contract_str(const qc_contract *c, const char *key, const char *dflt);
double qc_contract_num(const qc_contract *c, const char *key, double dflt);
/* 1 when key is present. */
int qc_contract_has(const qc_contract *c, const char *key);
const qc_kv *qc_contract_get(const qc_contract *c, const char *key);
/* Set (or replace) a key. */
int qc_contract_set(qc_contract *c, const char *key, const char *str, double num, int has_num);
/* Merge: every key of `over` replaces the same key in c. */
int qc_contract_merge(qc_contract *c, const qc_contract *over);
/* The keys every class takes besides its own (NULL-terminated):
 * compute_dtype, the dtype a module's own arithmetic rounds its
 * intermediate results to (float32, or bfloat16 in a pure-bf16 model). */
extern const qc_key_spec qc_common_keys[];
/* 1 when c says compute_dtype = bfloat16. */
int qc_contract_bf16_compute(const qc_contract *c);
/* Check c against a NULL-terminated spec list (and qc_common_keys):
 * unknown keys and values not allowed fail with a message naming `where`
 * and the key. Fills defaults. */
int qc_contract_validate(qc_contract *c, const qc_key_spec *spec, const char *where);
/* Render as a JSON object string into buf. */
char *qc_contract_json(const qc_contract *c, char *buf, int n);

/* The weight rounding a contract declares (docs/numerics.md, "Stochastic
 * rounding"): "rounding": {"sr": {"seed": S}} gives on = 1, seed S and
 *   salt   qc_sr_salt_id(sr_salt), the parameter's identity string; without
 *          sr_salt the legacy qc_sr_salt_path(module_path, "weight");
 *   step   sr_step (default 0), the optimizer step;
 *   expert sr_expert (default 0), a routed expert's global id;
 * anything else (absent, "rn") gives on = 0. A malformed sr_* key, or one
 * without rounding sr, is QC_EINPUT naming the module and the key. */
int qc_sr_from_contract(const qc_contract *c, const char *module_path, qc_sr *out);
/* The contract keys of the SR contract, for a class's key list. */
#define QC_SR_KEYS                                                                                                    \
  {"sr_salt", QC_KEY_STRING, NULL,                                                                                     \
   "stochastic rounding: the parameter's identity, hashed into the salt (absent: <module path>.weight, legacy)"},     \
      {"sr_step", NULL, NULL, "stochastic rounding: the optimizer step in the counter (absent: 0)"},                  \
      {"sr_expert", NULL, NULL, "stochastic rounding: a routed expert's global id in the counter (absent: 0)"}

#endif
