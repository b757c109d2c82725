#!/bin/sh
# check-layers.sh: the one dependency direction of src/ (README, "Layout"):
#
#   core <- numerics <- model <- {modules, reference} <- engine, sweep <- cli
#   backend: core, numerics;  io: core, numerics, model;  report: core, numerics, model
#   dist: core, numerics, backend (under engine, sweep and cli)
#
# A project include names its layer ("model/module.h"); this script reads
# every #include of src/ and fails on one that points against the direction,
# naming the file, the line and the rule it breaks. Library headers are
# confined too: HDF5 to io/, CUDA/cuBLAS/NCCL to backend/cuda/ and kernels/,
# MPI to dist/,
# cJSON out of the numeric layers; the engine names no module class. Usage: check-layers.sh [ROOT] (default:
# the repository this script is in). Exit 0 clean, 1 with violations.
set -u
root=${1:-"$(dirname "$0")/.."}
cd "$root" || exit 2

# allowed project layers per layer (its own included)
allowed() {
  case "$1" in
    core) echo "core" ;;
    numerics) echo "core numerics" ;;
    model) echo "core numerics model" ;;
    modules) echo "core numerics model backend modules" ;;
    reference) echo "core numerics model backend reference" ;;
    backend) echo "core numerics backend kernels" ;;
    io) echo "core numerics model io" ;;
    report) echo "core numerics model report" ;;
    dist) echo "core numerics backend dist" ;;
    classes) echo "core numerics model backend modules reference classes" ;;
    engine) echo "core numerics model backend io dist classes engine" ;;
    sweep) echo "core numerics model backend io dist classes engine sweep" ;;
    cli) echo "core numerics model backend io dist classes engine sweep report cli" ;;
    main) echo "core cli" ;;
    *) echo "" ;;
  esac
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | LC_ALL=C sort | while IFS= read -r f; do
  rel=${f#src/}
  case "$rel" in
    */*) layer=${rel%%/*} ;;
    main.c) layer=main ;;
    *) echo "$f: a source file at the top of src/: put it in a layer folder (core, numerics, model, ...)" >>"$out"; continue ;;
  esac
  ok=$(allowed "$layer")
  if [ -z "$ok" ]; then
    echo "$f: '$layer' is not a layer of src/: add it to scripts/check-layers.sh and the README's layout" >>"$out"
    continue
  fi
  grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | while IFS= read -r line; do
    n=${line%%:*}
    inc=$(printf '%s' "$line" | sed -n 's/.*#[[:space:]]*include[[:space:]]*\(["<][^">]*[">]\).*/\1/p')
    case "$inc" in
      \"*)
        name=${inc#\"}; name=${name%\"}
        case "$name" in
          qatcheck_plugin.h)
            case "$layer" in io) ;; *) echo "$f:$n: includes \"$name\": the plugin ABI is io's (io/plugin.c)" >>"$out" ;; esac
            continue ;;
          ./*|../*) echo "$f:$n: includes \"$name\": a relative path: name the layer instead (\"core/qc.h\")" >>"$out"; continue ;;
          */*) dep=${name%%/*} ;;
          *) echo "$f:$n: includes \"$name\": name the layer (\"$layer/$name\" or \"core/...\")" >>"$out"; continue ;;
        esac
        case " $ok " in
          *" $dep "*) ;;
          *) echo "$f:$n: includes \"$name\": $layer may use $(echo "$ok" | sed 's/ /, /g') only (core <- numerics <- model <- {modules, reference} <- engine, sweep <- cli; backend: core, numerics; io, report: core, numerics, model; dist: core, numerics, backend)" >>"$out" ;;
        esac
        # inside backend, only the CUDA backend reaches the kernels
        if [ "$dep" = kernels ]; then
          case "$rel" in backend/cuda/*) ;; *) echo "$f:$n: includes \"$name\": only backend/cuda/ calls the CUDA kernels" >>"$out" ;; esac
        fi
        ;;
      \<*)
        name=${inc#<}; name=${name%>}
        case "$name" in
          hdf5.h|hdf5_hl.h|H5*.h)
            case "$layer" in io) ;; *) echo "$f:$n: includes <$name>: HDF5 is io's alone (io/dump.c)" >>"$out" ;; esac ;;
          cuda*.h|cublas*.h|nccl.h|curand*.h)
            case "$rel" in backend/cuda/*) ;; *) echo "$f:$n: includes <$name>: CUDA is backend/cuda/'s alone" >>"$out" ;; esac ;;
          mpi.h|mpi_*.h|mpio.h)
            case "$layer" in dist) ;; *) echo "$f:$n: includes <$name>: MPI is dist/'s alone (who does which unit, how results come back)" >>"$out" ;; esac ;;
          cjson/*)
            case "$layer" in core|numerics|modules|reference|backend) echo "$f:$n: includes <$name>: JSON is read by the plan (model) and written by report/ and io/, not by $layer" >>"$out" ;; esac ;;
        esac
        ;;
    esac
  done
done
# kernels/ is CUDA code called by the CUDA backend only: it includes nothing of src/
# but numerics' header-only producer arithmetic (parith.h, recipe.h, minifloat.h),
# which the CPU quantizers run too
grep -n '#[[:space:]]*include[[:space:]]*"' kernels/*.cu kernels/*.cuh kernels/*.h 2>/dev/null | while IFS= read -r line; do
  inc=$(printf '%s' "$line" | sed -n 's/.*include[[:space:]]*"\([^"]*\)".*/\1/p')
  case "$inc" in
    numerics/parith.h|numerics/recipe.h|numerics/minifloat.h) ;; # numerics' header-only code shared with the kernels
    */*) echo "${line%%:*}:$(echo "$line" | cut -d: -f2): includes \"$inc\": kernels/ includes only its own headers and numerics' shared ones" >>"$out" ;;
  esac
done
# the generic engine names no module class: class-specific work is the
# class's own (its registry row: production, reference, fast path)
for cls in $(sed -n 's/^[[:space:]]*\.name = "\([a-z0-9_]*\)",.*/\1/p' src/modules/*.c | sort -u); do
  grep -n "\"$cls\"" src/engine/*.c src/engine/*.h 2>/dev/null | while IFS= read -r hit; do
    echo "${hit%%:*}:$(echo "$hit" | cut -d: -f2): names class \"$cls\": the engine is generic; put class-specific work in the class's registry row" >>"$out"
  done
done
if [ -s "$out" ]; then
  echo "layers: includes against the dependency direction:"
  sed 's/^/  /' "$out"
  exit 1
fi
exit 0
