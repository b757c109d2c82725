#!/bin/sh
# check-layers.sh: the one dependency direction of src/ (docs/architecture.md):
#
#   core <- numerics <- model <- {modules, reference} <- classes <- engine, sweep <- cli
#   backend: core, numerics;  io: core, numerics, model;  report: core, numerics, model
#   dist: core, numerics, backend (under engine, sweep and cli)
#
# Usage: check-layers.sh [ROOT [BUILD_DIR]] (ROOT: default the repository
# this script is in). Exit 0 clean, 1 with violations (each naming the
# file, the line or symbol, and the rule), 2 when ROOT cannot be read.
#
# Includes: a project include names its layer ("model/module.h"); every
# #include of src/ is read against the table below. Library headers are
# confined too: HDF5 to io/, CUDA/cuBLAS/NCCL to backend/cuda/ and kernels/,
# MPI to dist/, cJSON out of the numeric layers; the engine and the model
# name no module class (in code: a quoted class name outside comments);
# kernels/ includes only numerics' header-only producer arithmetic.
#
# Symbols (with BUILD_DIR, after the objects are built): `nm` of every
# object BUILD_DIR/src/<layer>/*.o (and BUILD_DIR/kernels/*.o) whose source
# still exists; each defined global symbol belongs to its object's layer,
# and an object that uses (U) a symbol of a layer it may not use fails,
# whatever its includes say (a hand-written prototype, a missing include).
# And every function an object of src/ exports (nm type T, but main) has a
# user outside its own object, or it fails as dead or to be made static. A
# user is: another object of the build (the tool's, the CUDA backend's:
# its .so resolves qc_* against the executable), a mention in the sources
# of tests/ or bench/ (unit, GPU and fuzz tests, plugins and benches link
# the same objects but are built after this check), or a quoted name in a
# source of src/ (looked up by dlsym: the CUDA backend's entry points).
# Without CUDA objects in BUILD_DIR (a CPU-only build) a mention in the
# CUDA sources (kernels/, src/backend/cuda/) counts instead of their nm.
#
# One pass: the whole tree goes through one awk (and one nm), so the check
# costs milliseconds and runs in every build.
set -u
root=${1:-"$(dirname "$0")/.."}
build=${2:-}
cd "$root" || exit 2
[ -d src ] || { echo "layers: $root has no src/" >&2; exit 2; }

# the table: layer:allowed layers (its own included). main is src/main.c.
table="core:core
numerics:core numerics
model:core numerics model
modules:core numerics model backend modules
reference:core numerics model backend reference
classes:core numerics model backend modules reference classes
backend:core numerics backend kernels
io:core numerics model io
report:core numerics model report
dist:core numerics backend dist
engine:core numerics model backend io dist classes engine
sweep:core numerics model backend io dist classes engine sweep
cli:core numerics model backend io dist classes engine sweep report cli
main:core cli
kernels:core numerics kernels"

srcs=$(find src kernels -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | LC_ALL=C sort)

# the objects of sources that exist (a stale object of a removed file is not read)
objs=
words=/dev/null
if [ -n "$build" ]; then
  [ -d "$build" ] || { echo "layers: no build folder $build" >&2; exit 2; }
  for f in $srcs; do
    case "$f" in
      *.c) o="$build/${f%.c}.o" ;;
      *.cu) o="$build/$f.o" ;;
      *) continue ;;
    esac
    [ -f "$o" ] && objs="$objs $o"
  done
  # the names used outside the build's objects (see "Symbols" above), one a line
  words=$(mktemp) || exit 2
  trap 'rm -f "$words"' EXIT
  ext=$(find tests bench -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null | LC_ALL=C sort)
  case "$objs" in
    *.cu.o*) ;;
    *) ext="$ext $(find kernels src/backend/cuda -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) 2>/dev/null | LC_ALL=C sort)" ;;
  esac
  # shellcheck disable=SC2086
  {
    [ -n "$(echo $ext)" ] && cat $ext | tr -c 'A-Za-z0-9_' '\n'
    find src -type f \( -name '*.c' -o -name '*.cu' \) -exec grep -ho '"[A-Za-z_][A-Za-z0-9_]*"' {} + | tr -d '"'
  } | grep '^[A-Za-z_]' | LC_ALL=C sort -u >"$words"
fi

prog='
function layer_of(rel,   p) {  # "src/model/case.c" -> "model"; "src/main.c" -> "main"
  if (rel ~ /^kernels\//) return "kernels"
  sub(/^src\//, "", rel)
  if (rel == "main.c" || rel == "main.o") return "main"
  if (index(rel, "/") == 0) return ""
  p = rel; sub(/\/.*/, "", p); return p
}
function may(l, dep) { return index(" " ok[l] " ", " " dep " ") > 0 }
function rule(l,   s) { s = ok[l]; gsub(/ /, ", ", s); return l " may use " s " only (" DIR ")" }
function bad(msg) { out[++nout] = msg }
BEGIN {
  while ((getline w < WORDS) > 0) ext[w] = 1
  DIR = "core <- numerics <- model <- {modules, reference} <- classes <- engine, sweep <- cli; backend: core, numerics; io, report: core, numerics, model; dist: core, numerics, backend"
  n = split(TABLE, rows, "\n")
  for (i = 1; i <= n; i++) { split(rows[i], kv, ":"); ok[kv[1]] = kv[2] }
  for (i = 1; i < ARGC; i++) {   # every file of src/ in a layer folder of the table (empty ones too)
    f = ARGV[i]; if (f !~ /^src\//) continue
    lay = layer_of(f)
    if (lay == "") { bad(f ": a source file at the top of src/: put it in a layer folder (core, numerics, model, ...)"); noscan[f] = 1 }
    else if (!(lay in ok)) { bad(f ": '\''" lay "'\'' is not a layer of src/: add it to scripts/check-layers.sh and docs/architecture.md"); noscan[f] = 1 }
  }
}
# ---- pass 1: the sources ----
FILENAME != "-" && FNR == 1 {
  f = FILENAME; lay = layer_of(f); skip = (f in noscan)
  incuda = (f ~ /^src\/backend\/cuda\//)
}
FILENAME != "-" && f ~ /^src\/modules\/[^\/]*\.c$/ && /^[ \t]*\.name = "[a-z0-9_]*",/ {
  c = $0; sub(/^[ \t]*\.name = "/, "", c); sub(/".*/, "", c); cls[c] = 1
}
FILENAME != "-" && f ~ /^src\/(engine|model)\// && /"[a-z0-9_]+"/ {  # code, not comments
  l = $0; gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", l); sub(/\/\/.*/, "", l)
  if (l !~ /^[ \t]*(\*|\/\*)/) { eng[++neng] = f ":" FNR; engl[neng] = l; engw[neng] = (f ~ /^src\/model\//) ? "model" : "engine" }
}
FILENAME != "-" && !skip && /^[ \t]*#[ \t]*include/ {
  line = $0; sub(/^[ \t]*#[ \t]*include[ \t]*/, "", line)
  where = f ":" FNR
  if (f ~ /^kernels\//) {
    if (line !~ /^"/) next
    name = substr(line, 2); sub(/".*/, "", name)
    if (name ~ /\// && name !~ /^numerics\/(parith|recipe|minifloat)\.h$/)
      bad(where ": includes \"" name "\": kernels/ includes only its own headers and numerics'\'' shared ones")
    next
  }
  if (line ~ /^"/) {
    name = substr(line, 2); sub(/".*/, "", name)
    if (name == "qatcheck_plugin.h") {
      if (lay != "io") bad(where ": includes \"" name "\": the plugin ABI is io'\''s (io/plugin.c)")
      next
    }
    if (name ~ /^\.\.?\//) { bad(where ": includes \"" name "\": a relative path: name the layer instead (\"core/qc.h\")"); next }
    if (name !~ /\//) { bad(where ": includes \"" name "\": name the layer (\"" lay "/" name "\" or \"core/...\")"); next }
    dep = name; sub(/\/.*/, "", dep)
    if (!may(lay, dep)) bad(where ": includes \"" name "\": " rule(lay))
    if (dep == "kernels" && !incuda) bad(where ": includes \"" name "\": only backend/cuda/ calls the CUDA kernels")
  } else if (line ~ /^</) {
    name = substr(line, 2); sub(/>.*/, "", name)
    if (name ~ /^(hdf5\.h|hdf5_hl\.h|H5.*\.h)$/) { if (lay != "io") bad(where ": includes <" name ">: HDF5 is io'\''s alone (io/dump.c)") }
    else if (name ~ /^(cuda.*\.h|cublas.*\.h|nccl\.h|curand.*\.h)$/) { if (!incuda) bad(where ": includes <" name ">: CUDA is backend/cuda/'\''s alone") }
    else if (name ~ /^(mpi\.h|mpi_.*\.h|mpio\.h)$/) { if (lay != "dist") bad(where ": includes <" name ">: MPI is dist/'\''s alone (who does which unit, how results come back)") }
    else if (name ~ /^cjson\//) { if (lay ~ /^(core|numerics|modules|reference|backend)$/) bad(where ": includes <" name ">: JSON is read by the plan (model) and written by report/ and io/, not by " lay) }
  }
}
# ---- pass 2: nm -A -P of the objects: "OBJ: SYMBOL TYPE [VALUE SIZE]" ----
FILENAME == "-" {
  o = $1; sub(/:$/, "", o); s = $2; t = $3
  r = substr(o, length(BUILD) + 2)
  if (t == "U") { used[s] = 1; k = o SUBSEP s; if (!(k in seen)) { seen[k] = 1; uo[++nu] = o; us[nu] = s; ul[nu] = layer_of(r) } }
  else if (t ~ /^[BCDGRSTVWi]$/) { def[s] = r; defl[s] = layer_of(r) }
  if (t == "T" && r ~ /^src\// && s != "main") { fs[++nf] = s; fo[nf] = r }
}
END {
  # the engine and the model are generic: they name no class (its row does the class-specific work)
  for (i = 1; i <= neng; i++)
    for (c in cls)
      if (index(engl[i], "\"" c "\"")) bad(eng[i] ": names class \"" c "\": the " engw[i] " is generic; put class-specific work in the class'\''s row (src/modules/" c ".c)")
  for (i = 1; i <= nu; i++) {
    s = us[i]; if (!(s in def)) continue        # a library symbol
    l = ul[i]; d = defl[s]
    if (l == "" || d == "" || may(l, d)) continue
    bad(substr(uo[i], length(BUILD) + 2) ": uses symbol " s " of " def[s] ": " rule(l))
  }
  # an exported function with no user outside its object: dead, or static
  for (i = 1; i <= nf; i++)
    if (!(fs[i] in used) && !(fs[i] in ext))
      bad(fo[i] ": exports " fs[i] ", which no other object, test or bench uses: make it static, or delete it")
  if (nout == 0) exit 0
  print "layers: dependencies against the direction:"
  for (i = 1; i <= nout; i++) print "  " out[i]
  exit 1
}
'
# shellcheck disable=SC2086
if [ -n "$objs" ]; then
  nm -A -P $objs | awk -v TABLE="$table" -v BUILD="$build" -v WORDS="$words" "$prog" $srcs -
else
  awk -v TABLE="$table" -v BUILD="$build" -v WORDS="$words" "$prog" $srcs - </dev/null
fi
