#!/bin/sh
# layers.sh: the build's two source checks. scripts/check-layers.sh passes on
# this tree (and on its objects, where built) and fails, naming the file,
# the line and the rule, on one copy of the tree with one include planted
# against each rule of the dependency direction (each planted, checked and
# undone in turn; a class name in engine/ or model/ code, not in a
# comment), and, naming the object and the symbol, on objects where a
# model/ file calls a modules/ function with no include at all, and on an
# object exporting a function no other object, test or bench uses (passed
# once a test source, a quoted name in src/, or in a CPU-only build a CUDA
# source, names it);
# scripts/check-independence.sh passes here and fails on a reference that
# includes a production module or calls the candidate's GEMM path.
. "$(dirname "$0")/lib.inc"
ROOT=$(pwd)
expect_exit 0 "the tree's includes follow the layers" sh "$ROOT/scripts/check-layers.sh" "$ROOT"
expect_exit 0 "the tree's reference is independent" sh "$ROOT/scripts/check-independence.sh" "$ROOT"
for b in build build-nocuda; do
  [ -d "$ROOT/$b/src/core" ] || continue
  expect_exit 0 "the objects of $b/ follow the layers" sh "$ROOT/scripts/check-layers.sh" "$ROOT" "$ROOT/$b"
done

# one copy of what the checks read
W="$T/tree"
mkdir -p "$W"
cp -r "$ROOT/src" "$ROOT/kernels" "$ROOT/scripts" "$W/"

# plant FILE INCLUDE NEEDLE: INCLUDE appended to FILE of the copy must fail
# the layer check with a line naming FILE and NEEDLE; FILE is restored after
plant() {
  file=$1; inc=$2; needle=$3
  cp "$W/$file" "$T/saved"
  printf '%s\n' "$inc" >>"$W/$file"
  expect_exit 1 "layers: $file with $inc is refused" sh "$W/scripts/check-layers.sh" "$W"
  grep -F "$file:" "$T/out" | grep -qF -- "$needle" || bad "layers: no line names $file and '$needle': $(cat "$T/out")"
  cp "$T/saved" "$W/$file"
}
plant src/core/tensor.c '#include "numerics/formats.h"' "core may use core only"
plant src/numerics/quant.c '#include "model/module.h"' "numerics may use core, numerics only"
plant src/model/case.c '#include "engine/audit.h"' "model may use core, numerics, model only"
plant src/model/registry.c '#include "modules/classes.h"' "model may use core, numerics, model only"
plant src/modules/gelu.c '#include "reference/ref_util.h"' "modules may use"
plant src/reference/gelu.c '#include "modules/mod_util.h"' "reference may use"
plant src/modules/gelu.c '#include "classes/registry.h"' "modules may use"
plant src/classes/registry.c '#include "engine/audit.h"' "classes may use"
plant src/backend/cpu.c '#include "model/module.h"' "backend may use core, numerics, backend, kernels only"
plant src/backend/cpu.c '#include "kernels/kernels.h"' "only backend/cuda/ calls the CUDA kernels"
plant src/io/dump.c '#include "engine/audit.h"' "io may use core, numerics, model, io only"
plant src/report/json.c '#include "sweep/sweep.h"' "report may use core, numerics, model, report only"
plant src/engine/audit.c '#include "cli/cli.h"' "engine may use"
plant src/engine/audit.c '#include "modules/mod_util.h"' "engine may use"
plant src/sweep/sweep.c '#include "report/report.h"' "sweep may use"
plant src/engine/fd.c '#include <hdf5.h>' "HDF5 is io's alone"
plant src/engine/vjp.c '#include <mpi.h>' "MPI is dist/'s alone"
plant src/sweep/pipeline.c '#include <mpi.h>' "MPI is dist/'s alone"
plant src/dist/dist.c '#include "model/module.h"' "dist may use core, numerics, backend, dist only"
plant src/dist/dist.c '#include <nccl.h>' "CUDA is backend/cuda/'s alone"
plant src/model/check.c '#include "dist/dist.h"' "model may use core, numerics, model only"
plant src/report/json.c '#include <cuda_runtime.h>' "CUDA is backend/cuda/'s alone"
plant src/numerics/quant.c '#include <cjson/cJSON.h>' "JSON is read by the plan"
plant src/engine/gen.c '#include "../core/qc.h"' "a relative path"
plant src/engine/gen.c '#include "qc.h"' "name the layer"
plant src/engine/audit.c 'static const char *k = "linear";' "the engine is generic"
plant src/model/coverage.c 'static const char *k = "moe";' "the model is generic"
plant kernels/quant.cu '#include "model/module.h"' "kernels/ includes only its own headers"
# a class named in a comment is no code naming it
cp "$W/src/model/coverage.c" "$T/saved"
printf '/* as "moe" does */\n// "rope"\n' >>"$W/src/model/coverage.c"
expect_exit 0 "layers: a class named in a model/ comment passes" sh "$W/scripts/check-layers.sh" "$W"
cp "$T/saved" "$W/src/model/coverage.c"
printf '/* a stray file */\n' >"$W/src/stray.c"
expect_exit 1 "layers: a file at the top of src/ is refused" sh "$W/scripts/check-layers.sh" "$W"
grep -q "src/stray.c" "$T/out" || bad "the stray file is not named: $(cat "$T/out")"
rm -f "$W/src/stray.c"
expect_exit 0 "layers: the copy passes again once every plant is undone" sh "$W/scripts/check-layers.sh" "$W"

# symbols: a model/ file that calls a modules/ function and reads a class
# object, declared by hand: no include says so, the objects do. Both files
# are compiled alone into a build folder of their own.
cat >"$W/src/modules/probe_mod.c" <<'C'
int qc_mod_probe(int x);
int qc_mod_probe(int x) { return x + 1; }
const int qc_class_probe = 7;
C
cat >"$W/src/model/probe_model.c" <<'C'
int qc_mod_probe(int x);
extern const int qc_class_probe;
int qc_model_probe(int x);
int qc_model_probe(int x) { return qc_mod_probe(x) + qc_class_probe; }
C
mkdir -p "$T/b/src/modules" "$T/b/src/model"
${CC:-cc} -c "$W/src/modules/probe_mod.c" -o "$T/b/src/modules/probe_mod.o" &&
  ${CC:-cc} -c "$W/src/model/probe_model.c" -o "$T/b/src/model/probe_model.o" || bad "symbols: the probes do not compile"
expect_exit 0 "symbols: the planted files include nothing against the direction" sh "$W/scripts/check-layers.sh" "$W"
expect_exit 1 "symbols: model/ calling a modules/ function is refused" sh "$W/scripts/check-layers.sh" "$W" "$T/b"
for sym in qc_mod_probe qc_class_probe; do
  grep -F "src/model/probe_model.o: uses symbol $sym of src/modules/probe_mod.o" "$T/out" | grep -qF "model may use core, numerics, model only" &&
    ok "symbols: the line names the object, $sym and the rule" || bad "symbols: no line names $sym: $(cat "$T/out")"
done
grep -q "probe_mod.o: uses" "$T/out" && bad "symbols: modules/ using nothing above it is named: $(cat "$T/out")"
# qc_model_probe has no user outside its object; qc_mod_probe has one
grep -F "src/model/probe_model.o: exports qc_model_probe, which no other object, test or bench uses" "$T/out" | grep -qF "make it static" &&
  ok "symbols: an exported function nobody uses is named" || bad "symbols: no line names qc_model_probe: $(cat "$T/out")"
grep -q "exports qc_mod_probe" "$T/out" && bad "symbols: a function another object uses is named dead: $(cat "$T/out")"

# exported functions nobody links: probe_mod.o alone in a build folder
# (a CPU-only one: no CUDA object), its qc_mod_probe used by nothing but
# what each step plants
mkdir -p "$T/c/src/modules"
cp "$T/b/src/modules/probe_mod.o" "$T/c/src/modules/"
rm -f "$W/src/model/probe_model.c"
dead() {
  expect_exit 1 "symbols: $1" sh "$W/scripts/check-layers.sh" "$W" "$T/c"
  grep -qF "src/modules/probe_mod.o: exports qc_mod_probe, which no other object, test or bench uses" "$T/out" ||
    bad "symbols: no line names qc_mod_probe: $(cat "$T/out")"
}
dead "an exported function no object, test or bench uses is refused"
mkdir -p "$W/tests/unit"
printf 'int qc_mod_probe(int x);\nTest(probe, one) { cr_expect(qc_mod_probe(0) == 1); }\n' >"$W/tests/unit/test_probe.c"
expect_exit 0 "symbols: a function a unit test calls is used" sh "$W/scripts/check-layers.sh" "$W" "$T/c"
rm -f "$W/tests/unit/test_probe.c"
cp "$W/src/io/plugin.c" "$T/saved"
printf 'void *qc_io_probe(void *h);\nvoid *qc_io_probe(void *h) { return dlsym(h, "qc_mod_probe"); }\n' >>"$W/src/io/plugin.c"
expect_exit 0 "symbols: a function looked up by name (dlsym) is used" sh "$W/scripts/check-layers.sh" "$W" "$T/c"
cp "$T/saved" "$W/src/io/plugin.c"
printf 'extern "C" int qc_mod_probe(int x);\nint cu_probe(void) { return qc_mod_probe(1); }\n' >"$W/src/backend/cuda/probe.cu"
expect_exit 0 "symbols: without CUDA objects, a function a CUDA source calls is used" sh "$W/scripts/check-layers.sh" "$W" "$T/c"
mkdir -p "$T/c/src/backend/cuda"
printf 'typedef int probe_t;\n' >"$T/probe_cu.c"
${CC:-cc} -c "$T/probe_cu.c" -o "$T/c/src/backend/cuda/probe.cu.o" || bad "symbols: the CUDA object stand-in does not compile"
dead "with CUDA objects, their nm counts, not the CUDA sources' text"
rm -f "$W/src/backend/cuda/probe.cu" "$W/src/modules/probe_mod.c"

# independence: a reference that borrows production code fails
for planted in '#include "modules/mod_util.h"' 'static int x(void) { return qc_mod_dummy(); }'; do
  cp "$W/src/reference/linear.c" "$T/saved"
  printf '%s\n' "$planted" >>"$W/src/reference/linear.c"
  expect_exit 1 "independence: reference with '$planted' is refused" sh "$W/scripts/check-independence.sh" "$W"
  grep -q "src/reference/linear.c" "$T/out" || bad "independence: the file is not named: $(cat "$T/out")"
  cp "$T/saved" "$W/src/reference/linear.c"
done
cp "$W/src/modules/gelu.c" "$T/saved"
printf 'static int y(void) { return qc_ref_gelu(0, 0, 0, 0); }\n' >>"$W/src/modules/gelu.c"
expect_exit 1 "independence: a module that calls the reference is refused" sh "$W/scripts/check-independence.sh" "$W"
grep -q "src/modules/gelu.c" "$T/out" || bad "independence: the module is not named: $(cat "$T/out")"
cp "$T/saved" "$W/src/modules/gelu.c"
finish
