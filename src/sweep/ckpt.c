/* ckpt.c: layer 2 over a safetensors checkpoint (see sweep.h): the linear
 * weights found by name, each a module of the sweep, dY and X generated or
 * taken from an HDF5 dump's groups of the same name. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/pattern.h"
#include "core/qc.h"
#include "io/dump.h"
#include "io/safetensors.h"
#include "sweep/plan.h"
#include "sweep/sweep.h"

/* Does s contain `word` (any case)? */
static int contains_nocase(const char *s, const char *word) {
  size_t w = strlen(word);
  for (const char *p = s; *p; p++)
    if (strncasecmp(p, word, w) == 0) return 1;
  return 0;
}

/* Is path component `word` in s (split at '.' and '/')? */
static int has_component(const char *s, const char *word) {
  size_t w = strlen(word);
  for (const char *p = s; (p = strstr(p, word)) != NULL; p += w) {
    int starts = p == s || p[-1] == '.' || p[-1] == '/';
    int ends = p[w] == 0 || p[w] == '.' || p[w] == '/';
    if (starts && ends) return 1;
  }
  return 0;
}

static int is_master_dtype(int dt) { return dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64; }

static int cmp_entry(const void *a, const void *b) {
  return qc_sweep_cmp_natural(((const sw_entry *)a)->path, ((const sw_entry *)b)->path);
}

/* Is t a linear weight by the naming rules above (any dtype)? Then its
 * module path "/<module>" into path. */
static int qc_ckpt_linear_weight(const qc_st_tensor *t, char *path, size_t n) {
  size_t l = strlen(t->name);
  if (l < 8 || strcmp(t->name + l - 7, ".weight") != 0) return 0;
  if (t->ndim != 2 && !(t->ndim == 3 && has_component(t->name, "experts"))) return 0;
  if (contains_nocase(t->name, "embed")) return 0; /* embeddings are 2-D but no linear */
  if (l - 7 + 2 > n) return 0;
  snprintf(path, n, "/%.*s", (int)(l - 7), t->name);
  return 1;
}

/* Each entry's deployed format from the checkpoint's quantization config
 * (o->deployed -1 and a config with one: *oo's deployed becomes 1). */
static int deployed_formats(const qc_sweep_opts *o, sw_entry *se, int n, qc_sweep_opts *oo, qc_sweep *s) {
  sw_qconfig c;
  int rc;
  *oo = *o;
  if (oo->deployed < 0) oo->deployed = 0;
  if (o->deployed == 0 || !o->qconfig) return QC_OK;
  if ((rc = qc_sweep_qconfig_open(o->qconfig, &c))) goto done;
  if (!c.q) goto done;
  oo->deployed = 1;
  snprintf(s->wsource, sizeof s->wsource, "%s: quantization_config (quant_method %s)", o->qconfig, c.method);
  for (int i = 0; i < n && !rc; i++)
    rc = qc_sweep_qconfig_format(&c, se[i].path, se[i].wfmt, sizeof se[i].wfmt, se[i].wfmt_why, sizeof se[i].wfmt_why);
done:
  qc_sweep_qconfig_close(&c);
  return rc;
}

int qc_contract_sweep_ckpt(qc_st *st, qc_dump *dy, const qc_backend *be, const qc_sweep_opts *o, qc_sweep *s) {
  qc_tsrc wsrc, dsrc;
  qc_sweep_opts oo;
  sw_entry *se = NULL;
  regex_t re;
  int use_re = 0, n = 0, nquant = 0, nlin = 0, rc = QC_OK, matched_dy = 0;
  const qc_st_tensor *quant_eg = NULL;
  char path[QC_PATHLEN], first[QC_PATHLEN] = "", missing_dy[QC_PATHLEN] = "";
  memset(s, 0, sizeof *s);
  qc_tsrc_st(&wsrc, st);
  if (dy) qc_tsrc_dump(&dsrc, dy);
  if (o->modules && o->modules[0]) {
    if ((rc = qc_pattern_compile(&re, o->modules, "--modules"))) return rc;
    use_re = 1;
  }
  if (!(se = calloc((size_t)(qc_st_count(st) ? qc_st_count(st) : 1), sizeof *se))) { rc = qc_err_sys("out of memory"); goto done; }
  for (int i = 0; i < qc_st_count(st); i++) {
    const qc_st_tensor *t = qc_st_at(st, i);
    if (!qc_ckpt_linear_weight(t, path, sizeof path)) continue;
    if (is_master_dtype(t->dtype)) {
      nlin++;
      if (!first[0]) snprintf(first, sizeof first, "%s", path);
    }
    if (use_re && regexec(&re, path, 0, NULL, 0) != 0) continue;
    if (!is_master_dtype(t->dtype)) {
      if (!quant_eg) quant_eg = t;
      nquant++;
      continue;
    }
    sw_entry *e = &se[n++];
    snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->wname, sizeof e->wname, "%s", t->name);
    e->wsrc = &wsrc;
    if (dy && qc_dump_exists(dy, path)) {
      e->dsrc = &dsrc;
      matched_dy++;
    } else if (dy && !missing_dy[0]) {
      snprintf(missing_dy, sizeof missing_dy, "%s", path);
    }
  }
  if (nquant) { /* a deployed checkpoint (or part of one): its weights are no master */
    rc = qc_err("checkpoint '%s': %d linear weight(s) are stored quantized (e.g. '%s' %s): expected a master checkpoint "
                "(BF16, F16, F32 or F64 weights)", qc_st_path(st), nquant, quant_eg->name, quant_eg->st_dtype);
    qc_hint("check a deployed checkpoint's bytes against its master with 'qatcheck quant --checkpoint DEPLOYED --master "
            "MASTER'; --modules can leave the quantized modules out");
    goto done;
  }
  if (n == 0) {
    if (nlin == 0) {
      rc = qc_err("checkpoint '%s': no linear weight: expected 2-D tensors named '<module>.weight' (or routed experts "
                  "[E, N, K] under an 'experts' component)", qc_st_path(st));
    } else {
      rc = qc_err("checkpoint '%s': no linear weight matches --modules '%s' (%d linear weight(s), e.g. '%s')",
                  qc_st_path(st), o->modules, nlin, first);
    }
    goto done;
  }
  if (dy && matched_dy == 0) {
    qc_dump_entry *de = NULL;
    int nde = 0;
    qc_dump_modules(dy, NULL, &de, &nde);
    rc = qc_err("--dy '%s': no group of the dump has the path of a checkpoint module (e.g. '%s')", qc_dump_path(dy),
                se[0].path);
    if (nde) qc_hint("the dump's groups are named like '%s': the checkpoint's tensor name without '.weight', after a '/'", de[0].path);
    free(de);
    goto done;
  }
  if (dy && missing_dy[0]) { /* one batch for every layer: no layer's dY made up beside real ones */
    rc = qc_err("--dy '%s': module '%s' of the checkpoint has no group in the dump (%d of %d modules have one): expected "
                "every module's dY from the dump's batch", qc_dump_path(dy), missing_dy, matched_dy, n);
    qc_hint("leave the modules the dump lacks out with --modules, or leave out --dy for generated dY");
    goto done;
  }
  if (n > 1) qsort(se, (size_t)n, sizeof *se, cmp_entry);
  if ((rc = deployed_formats(o, se, n, &oo, s))) goto done;
  rc = qc_sweep_entries(se, n, qc_st_path(st), be, &oo, s);
done:
  if (use_re) regfree(&re);
  free(se);
  return rc;
}
