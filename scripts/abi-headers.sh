#!/bin/sh
# abi-headers.sh: the headers that cross the boundary between qatcheck and
# its CUDA backend libqatcheck_cuda.so, and the hash both halves are stamped
# with (src/backend/backend.h, "The stamp"; docs/gpu.md).
#
#   sh scripts/abi-headers.sh [-C DIR] list     the headers, one a line, sorted
#   sh scripts/abi-headers.sh [-C DIR] hash     16 hex digits: the sha256 of their paths and bytes
#   sh scripts/abi-headers.sh [-C DIR] check FILE.d...
#                                               every boundary header the compiler read (its
#                                               -MMD lists of the .so's objects) is in the list
#
# The set, found from the includes: every header of the repository that the
# .so's sources (src/backend/cuda/*.cu, kernels/*.cu) include, directly or
# through another header, except the .so's own (kernels/, and
# src/backend/cuda/ but for cuda.h, its exported interface). A new header on
# the boundary joins the set when it is included; `check` (run as the .so is
# linked) catches one the include scan missed. Exit 0, 1 on a failed check,
# 2 on bad usage.
set -u
if [ "${1:-}" = -C ]; then
  cd "$2" || exit 2
  shift 2
fi
mode=${1:-}
[ -d src/backend/cuda ] || { echo "abi-headers: no src/backend/cuda/ here ($(pwd))" >&2; exit 2; }

# every header reached from the seeds, resolved as the compilers do (the
# including file's folder, then -I. -Isrc -Iinclude), paths from the root
reached() {
  ls src/backend/cuda/*.cu kernels/*.cu 2>/dev/null | awk '
    function readable(p,   l, r) { r = (getline l < p); if (r >= 0) close(p); return r >= 0 }
    function norm(p) { while (sub(/^\.\//, "", p)) ; while (sub(/\/\.\//, "/", p)) ; while (sub(/[^\/]+\/\.\.\//, "", p)) ; return p }
    function resolve(from, name,   d, c) {
      d = from; if (!sub(/\/[^\/]*$/, "", d)) d = "."
      c = norm(d "/" name); if (readable(c)) return c
      c = norm(name); if (readable(c)) return c
      c = norm("src/" name); if (readable(c)) return c
      c = norm("include/" name); if (readable(c)) return c
      return ""
    }
    { q[++n] = $0; seen[$0] = 1 }
    END {
      for (i = 1; i <= n; i++) {
        f = q[i]
        while ((getline line < f) > 0) {
          if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
          sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", line)
          sub(/".*/, "", line)
          h = resolve(f, line)
          if (h != "" && !(h in seen)) { seen[h] = 1; q[++n] = h }
        }
        close(f)
      }
      for (i = 1; i <= n; i++) if (q[i] !~ /\.cu$/) print q[i]
    }'
}

# the boundary: the reached headers but the .so's own
list() {
  all=$(reached)
  { printf '%s\n' "$all" | grep -v -e '^kernels/' -e '^src/backend/cuda/'
    printf '%s\n' "$all" | grep -x 'src/backend/cuda/cuda\.h'; } | LC_ALL=C sort -u
}

case "$mode" in
  list)
    list
    ;;
  hash)
    files=$(list)
    [ -n "$files" ] || { echo "abi-headers: no boundary header found" >&2; exit 2; }
    if command -v sha256sum >/dev/null 2>&1; then sum="sha256sum"
    elif command -v shasum >/dev/null 2>&1; then sum="shasum -a 256"
    else echo "abi-headers: neither sha256sum nor shasum found" >&2; exit 2; fi
    for f in $files; do printf '== %s\n' "$f"; cat "$f"; done | $sum | cut -c1-16
    ;;
  check)
    shift
    listed=$(list)
    # the repository headers the compiler read (relative paths, not the system's)
    read_h=$(cat "$@" | tr ' \\' '\n\n' | sed -e 's/:$//' -e 's#^\./##' | grep -e '\.h$' -e '\.cuh$' | grep -v '^/' | LC_ALL=C sort -u)
    fails=0
    for h in $read_h; do
      case "$h" in kernels/*) continue ;; src/backend/cuda/cuda.h) ;; src/backend/cuda/*) continue ;; esac
      printf '%s\n' "$listed" | grep -qx -- "$h" && continue
      echo "abi-headers: the CUDA backend compiles $h, which the include scan of scripts/abi-headers.sh did not find: the stamp's hash would miss it" >&2
      fails=1
    done
    exit $fails
    ;;
  *)
    echo "usage: sh scripts/abi-headers.sh [-C DIR] list | hash | check FILE.d..." >&2
    exit 2
    ;;
esac
