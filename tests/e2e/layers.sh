#!/bin/sh
# layers.sh: the build's two source checks. scripts/check-layers.sh passes on
# this tree and fails, naming the file, the line and the rule, on a copy with
# one include planted against each rule of the dependency direction;
# scripts/check-independence.sh passes here and fails on a reference that
# includes a production module or calls the candidate's GEMM path.
. "$(dirname "$0")/lib.inc"
ROOT=$(pwd)
expect_exit 0 "the tree's includes follow the layers" sh "$ROOT/scripts/check-layers.sh" "$ROOT"
expect_exit 0 "the tree's reference is independent" sh "$ROOT/scripts/check-independence.sh" "$ROOT"

# plant FILE INCLUDE NEEDLE: a fresh copy of src/ and kernels/ with INCLUDE
# appended to FILE must fail the layer check with a line naming FILE and NEEDLE
plant() {
  file=$1; inc=$2; needle=$3
  rm -rf "$T/tree"; mkdir -p "$T/tree"; cp -r "$ROOT/src" "$ROOT/kernels" "$T/tree/"
  printf '%s\n' "$inc" >>"$T/tree/$file"
  expect_exit 1 "layers: $file with $inc is refused" sh "$ROOT/scripts/check-layers.sh" "$T/tree"
  grep -F "$file:" "$T/out" | grep -qF -- "$needle" || bad "layers: no line names $file and '$needle': $(cat "$T/out")"
}
plant src/core/tensor.c '#include "numerics/formats.h"' "core may use core only"
plant src/numerics/quant.c '#include "model/module.h"' "numerics may use core, numerics only"
plant src/model/case.c '#include "engine/audit.h"' "model may use core, numerics, model only"
plant src/modules/gelu.c '#include "reference/ref_util.h"' "modules may use"
plant src/reference/gelu.c '#include "modules/mod_util.h"' "reference may use"
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
rm -rf "$T/tree"; mkdir -p "$T/tree"; cp -r "$ROOT/src" "$ROOT/kernels" "$T/tree/"
printf '/* a stray file */\n' >"$T/tree/src/stray.c"
expect_exit 1 "layers: a file at the top of src/ is refused" sh "$ROOT/scripts/check-layers.sh" "$T/tree"
grep -q "src/stray.c" "$T/out" || bad "the stray file is not named: $(cat "$T/out")"

# independence: a reference that borrows production code fails
for planted in '#include "modules/mod_util.h"' 'static int x(void) { return qc_mod_dummy(); }'; do
  rm -rf "$T/tree"; mkdir -p "$T/tree"; cp -r "$ROOT/src" "$ROOT/kernels" "$T/tree/"
  printf '%s\n' "$planted" >>"$T/tree/src/reference/linear.c"
  expect_exit 1 "independence: reference with '$planted' is refused" sh "$ROOT/scripts/check-independence.sh" "$T/tree"
  grep -q "src/reference/linear.c" "$T/out" || bad "independence: the file is not named: $(cat "$T/out")"
done
finish
