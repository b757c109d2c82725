#!/bin/sh
# toy_class.sh: a new module class takes six files (docs/contributing.md,
# "Adding a module class"). On a copy of this tree (its tracked and
# unignored files, and the objects of its build folder so that only what
# changes compiles) the test adds the toy class scale2 (y = 2 x, d_x = 2 dY)
# in exactly these six: its module file, its reference file, one line of
# the class table, one case, one section of docs/classes.md, one unit test.
# Then the CPU tool and the unit tests build (the layer and independence
# checks included; with the tree's objects a few files compile, without
# them the CPU tool compiles whole, NO_CUDA=1), `qatcheck classes --json` lists scale2 with its
# gradient, its case passes `vjp`, `fd` agrees on it, the generic unit
# sweeps (fd over every class with a forward, every class's gradients
# and tensors) and its own test pass, and the copy's git status names the
# six files and nothing else, the class table with one added line. A class
# that needed a seventh file fails here: the build, a check or a sweep
# breaks, or the count does.
. "$(dirname "$0")/lib.inc"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v git >/dev/null && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 ||
  { echo "skip: toy_class copies the tree with git ls-files, and $ROOT is no git work tree"; exit 77; }

# the build folder whose objects to reuse: the Makefile's with nvcc (build,
# its CUDA objects up to date under the same stamp), else the CPU tool's
# (build-nocuda, NO_CUDA=1: what compiles is C only, no nvcc)
B=build-nocuda; NOCUDA=NO_CUDA=1
if [ -n "$(ls "$ROOT"/src/backend/cuda/*.cu 2>/dev/null)" ] && [ -d "$ROOT/build/src" ] &&
   { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then B=build; NOCUDA=; fi
W="$T/tree"
mkdir -p "$W"
# the tree as the build sees it: tracked and unignored files that exist, times kept
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh | tar --null -T - -cf -) |
  tar -C "$W" -xf - || { bad "cannot copy the tree"; finish; }
# its objects: only the toy's files and what names them compile again
if [ -d "$ROOT/$B/src" ]; then
  mkdir -p "$W/$B"
  for d in src kernels tests commit.stamp sources.ok symbols.ok; do
    [ -e "$ROOT/$B/$d" ] && cp -pR "$ROOT/$B/$d" "$W/$B/"
  done
fi
COMMIT=$(cat "$ROOT/$B/commit.stamp" 2>/dev/null || git -C "$ROOT" describe --always --dirty --abbrev=7)
G="git -C $W -c user.name=toy -c user.email=toy@example.invalid"
$G init -q && $G add -A && $G commit -qm "the tree" || { bad "cannot make the copy a repository"; finish; }

# ---- the six files --------------------------------------------------------------------

# 1. the module file: the class's row, its production VJP, generator, forward, error model
cat >"$W/src/modules/scale2.c" <<'C'
/* modules/scale2.c: the toy class scale2 (tests/e2e/toy_class.sh), as a
 * trainer computes it in float32.
 *
 *   forward  y = 2 x
 *   d_x      2 dy */
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/mod_util.h"

/* The derivative 2, in float32. */
static float scale2_deriv(float x, int variant) {
  (void)x;
  (void)variant;
  return 2.0f;
}

/* The production VJP: d_x = 2 dy. */
static int scale2_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_mod_unary_vjp(m, dy, grads, scale2_deriv, 0);
}

/* y = 2 x in float64 (for fd). */
static double scale2_fn(double x, double bx, int variant) {
  (void)bx;
  (void)variant;
  return 2 * x;
}

/* The float64 forward `qatcheck fd` differences. */
static int scale2_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  return qc_mod_unary_forward(m, branch, y, scale2_fn, 0);
}

/* Generated scale2: [T, F], x ~ N(0,1) bf16 (mod_util.h). */
static int scale2_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_mod_unary_generate("scale2", gp, rng, m, ondim, oshape, 1.0);
}

/* The error model: elementwise, one float32 rounding. */
static int scale2_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  if (strcmp(grad, "d_x") != 0) return qc_err("%s: class scale2 has no gradient '%s'", m->path, grad);
  qc_mod_tm(tm, 1, 1, 0, 0, "elementwise (K = 1): 2 dY, one float32 rounding");
  return QC_OK;
}

static const qc_key_spec scale2_keys[] = {{NULL, NULL, NULL, NULL}};

const qc_class qc_class_scale2 = {
    .name = "scale2",
    .summary = "y = 2 x (a toy): d_x",
    .tensors = "inputs/x outputs/y",
    .grads = "d_x",
    .shape_help = "[T, F]: tokens, features",
    .keys = scale2_keys,
    .generate = scale2_generate,
    .production = scale2_vjp,
    .not_checked = "",
    .forward = scale2_forward,
    .fd_shape = "9,21",
    .tol_model = scale2_tol_model,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
};
C

# 2. the reference file: the float64 VJP from the math, its one export
cat >"$W/src/reference/scale2.c" <<'C'
/* reference/scale2.c: float64 VJP of y = 2 x: d_x = 2 dy. The terms'
 * scale: one product, |d_x| itself. */
#include "model/module.h"
#include "reference/ref_util.h"

/* The derivative: 2 (and the magnitude of its one term). */
static double scale2_grad(double x, int variant) {
  (void)x;
  (void)variant;
  return 2.0;
}

/* The float64 VJP (a qc_vjp_fn). */
static int ref_scale2(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_refu_pointwise(ctx, m, dy, grads, scale2_grad, 0);
}

const qc_reference qc_reference_scale2 = {.vjp = ref_scale2, .terms = 1};
C

# 3. the class table: one line
sed -i 's|^\(  \)/\* a new class: its line above this one \*/|  QC_CLASS(scale2)           \\\n&|' "$W/src/classes/registry.c"

# 4. a case, its tolerance derived from the class's error model
cat >"$W/cases/scale2.json" <<'J'
{
  "name": "scale2",
  "description": "The toy class: d_x = 2 dy in float32.",
  "module": "scale2",
  "contract": {},
  "data": {"generate": {"shapes": [[1, 64], [127, 100]], "seed": 0}},
  "candidate": "builtin",
  "dy": ["random", "zero", "sparse"],
  "tolerances": {"d_x": {"derive": true}}
}
J

# 5. its section in docs/classes.md
cat >>"$W/docs/classes.md" <<'M'

## scale2 (a toy)

y = 2 x on inputs/x [T, F]; d_x = 2 dy, which the float32 production
computes exactly from bf16 inputs. No contract keys. Shipped case:
cases/scale2.json.
M

# 6. its unit test (the class harness: the sweep, a planted defect, fd)
cat >"$W/tests/unit/test_scale2.c" <<'C'
/* test_scale2.c: the toy class scale2: builtin against the reference, a
 * planted defect (d_x = dy) fails on d_x, fd agrees. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "class_harness.h"
#include "core/qc.h"

static const char *shapes[] = {"1,64", "127,100", "3,5"};

Test(scale2, builtin_matches_reference) {
  const char *const *sets[] = {NULL};
  h_sweep("scale2", shapes, 3, sets, 1, 71, 1e-6, 1e-6);
}

/* d_x = dy: the factor 2 forgotten. */
static int forgot_factor(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  double *d = h_f64(dy);
  h_set(grads, "d_x", d, qc_numel(dy));
  free(d);
  return QC_OK;
}

Test(scale2, planted_defect_fails) {
  h_inst in;
  h_make(&in, "scale2", "7,33", 3, "normal", NULL);
  h_expect_fail(&in, forgot_factor, 1e-6, "d_x");
  h_free(&in);
}

Test(scale2, fd_agrees) {
  const char *const sets[1][3] = {{NULL}};
  h_fd_agrees("scale2", shapes, 3, sets, 1, 5);
}
C

# ---- it builds and works ----------------------------------------------------------------
MK="make -C $W --no-print-directory -j2 QC_COMMIT=$COMMIT BUILD=$B $NOCUDA"
if ! $MK qatcheck "$B/test_unit" >"$T/make.log" 2>&1; then
  bad "the tree with scale2 does not build"; tail -20 "$T/make.log"; finish
fi
ok "the CPU tool and the unit tests build with scale2 (layer and independence checks passed)"
grep -E '^(cc|gcc|clang|nvcc|\S*/nvcc) .* -c ' "$T/make.log" | sed 's/.* -c \([^ ]*\).*/  compiled \1/'
Q="$W/qatcheck"
expect_exit 0 "qatcheck classes --json" "$Q" classes --json
"$PY" -c 'import json,sys; c = [c for c in json.load(sys.stdin)["classes"] if c["name"] == "scale2"]
sys.exit(0 if c and c[0]["grads"] == ["d_x"] and c[0]["fd"] and c[0]["inputs"] == ["x"] else 1)' <"$T/out" &&
  ok "classes --json lists scale2 with its gradient d_x" || bad "classes --json: scale2 missing or wrong"
expect_exit 0 "vjp on cases/scale2.json passes" "$Q" vjp --case "$W/cases/scale2.json" --json "$T/r.json"
grep -q '"verdict":[[:space:]]*"pass"' "$T/r.json" || bad "the scale2 report does not say pass"
expect_exit 0 "fd --module scale2 agrees" "$Q" fd --module scale2 --quiet
"$Q" vjp --help | grep -q "^  scale2 " && ok "vjp --help lists scale2" || bad "vjp --help does not list scale2"
expect_exit 0 "the unit tests of scale2 and the generic sweeps (fd, robust) pass" \
  "$W/$B/test_unit" --filter '@(scale2|fd|robust)/*'
# its own three ran and passed (the planted defect failed on d_x), and the fd sweep covered it
"$W/$B/test_unit" --filter 'scale2/*' >"$T/u.log" 2>&1
grep -q "Tested: 3 | Passing: 3 | Failing: 0" "$T/u.log" && ok "scale2's own tests ran" || bad "scale2's own tests: $(tail -3 "$T/u.log")"
(cd "$W" && QATCHECK="$Q" sh tests/e2e/classes.sh >"$T/classes.log" 2>&1) &&
  ok "tests/e2e/classes.sh passes with scale2" || { bad "tests/e2e/classes.sh with scale2"; tail -5 "$T/classes.log"; }

# ---- six files, nothing else ------------------------------------------------------------------
$G status --porcelain --untracked-files=all | sort >"$T/status"
cat >"$T/want" <<'S'
 M docs/classes.md
 M src/classes/registry.c
?? cases/scale2.json
?? src/modules/scale2.c
?? src/reference/scale2.c
?? tests/unit/test_scale2.c
S
sort "$T/want" -o "$T/want"
if cmp -s "$T/status" "$T/want"; then ok "git status names the six files and nothing else"
else bad "git status is not the six files:"; diff "$T/want" "$T/status" | sed 's/^/      /'; fi
[ "$($G diff --numstat src/classes/registry.c | cut -f1-2)" = "$(printf '1\t0')" ] &&
  ok "the class table gained one line" || bad "the class table's change is not one added line: $($G diff src/classes/registry.c)"
finish
