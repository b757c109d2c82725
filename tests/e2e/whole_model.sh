#!/bin/sh
# whole_model.sh: the limits of a whole model agree with each other (issue
# #42, 4). At about 12,800 modules vjp wrote a JSON report over 64 MiB that
# `report` and --baseline then refused; now the reader takes whatever vjp
# can write (docs/robustness.md, "Limits on what is read"). A vjp report of
# 20,000 modules, generated here in the shape vjp writes (a real
# one-module report, its module and checks repeated under 20,000 names:
# running vjp on 20,000 modules would take minutes), is read by `report`,
# by `report --baseline` against itself and by `vjp --baseline`. The limit
# opens no memory hole: a 2,000,000,000-byte sparse file under it is
# refused at its first byte, its peak RSS within 100 MB of the same
# binary's on a one-byte file, and a file of tiny
# values denser than any report before it is parsed.
. "$(dirname "$0")/lib.inc"

# ---- a 20,000-module vjp report ---------------------------------------------------------
"$QATCHECK" vjp --case cases/linear_dump.json --json "$T/one.json" --quiet || { bad "vjp: the one-module report"; finish; }
$PY - "$T/one.json" "$T/big.json" 20000 <<'P' || { bad "generating the 20,000-module report"; finish; }
import json, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(src))
mod = r["modules"][0]
dy0 = mod["dy"][0]["name"]  # one dY a module, as a whole-model dump has
checks = [c for c in r["checks"] if c["dy"] == dy0]
mod["dy"], mod["checks"] = mod["dy"][:1], len(checks)
mods, chks = [], []
for i in range(n):  # the experts of an MoE model: 80 layers of 250
    name = "/model.layers.%d.mlp.experts.%d.down_proj" % (i // 250, i % 250)
    mods.append(dict(mod, module=name))
    chks.extend(dict(c, module=name) for c in checks)
r["modules"], r["checks"] = mods, chks
r["totals"].update(checks=len(chks), passed=len(chks), failed=0, modules=n)
with open(out, "w") as f:  # cJSON_Print's layout: tabs, "key":<tab>value
    json.dump(r, f, indent="\t", separators=(",", ":\t"))
P
size=$(wc -c <"$T/big.json")
[ "$size" -gt 67108864 ] && ok "the 20,000-module report is $size bytes, over the old 64 MiB" || bad "the report is only $size bytes"
expect_exit 0 "report reads the 20,000-module report" "$QATCHECK" report "$T/big.json" --allow-incomplete
grep -q "layer 1 (vjp): 60000 check(s), 0 failed (pass)" "$T/out" && ok "its 60,000 checks counted" || bad "console: $(head -2 "$T/out") $(head -2 "$T/err")"
expect_exit 0 "report --baseline: the report against itself" "$QATCHECK" report "$T/big.json" --baseline "$T/big.json" --fail-on regression --allow-incomplete
grep -q "0 regression(s); 60000 matched, 0 new, 0 vanished" "$T/out" && ok "every check matched" || bad "baseline: $(grep baseline "$T/out")"
expect_exit 0 "vjp --baseline the 20,000-module report" "$QATCHECK" vjp --case cases/linear_dump.json --baseline "$T/big.json" --quiet
rm -f "$T/big.json"

# ---- what the limit does not let in --------------------------------------------------------
truncate -s 2000000000 "$T/sparse.json"
printf '\000' >"$T/one_byte.json"
rss() { # FILE: exit code and peak RSS (KB) of `report FILE`, its stderr in $T/err
  $PY -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "w"), timeout=60).returncode
print(r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$T/err" "$QATCHECK" report "$1"
}
rss "$T/one_byte.json" >"$T/rss0"
read -r code0 kb0 <"$T/rss0"
rss "$T/sparse.json" >"$T/rss"
read -r code kb <"$T/rss"
[ "$code" = 2 ] && grep -q "byte 0 is 0x00: not JSON text" "$T/err" && ok "a 2,000,000,000-byte sparse file is refused at its first byte" \
  || bad "sparse: exit $code: $(head -1 "$T/err")"
# against the same binary refusing a one-byte file (a sanitizer build holds its own shadow memory)
[ $((kb - kb0)) -lt 102400 ] && ok "sparse: peak RSS $kb KB, $((kb - kb0)) KB over a one-byte file" \
  || bad "sparse: peak RSS $kb KB, $((kb - kb0)) KB over a one-byte file's $kb0 KB: over 100 MB"
rm -f "$T/sparse.json"
$PY -c 'import sys; open(sys.argv[1], "w").write("[" + "0," * 6000000 + "0]")' "$T/dense.json"
expect_exit 2 "a file of 6,000,001 tiny values is refused" "$QATCHECK" report "$T/dense.json"
grep -q "denser than any qatcheck report" "$T/err" && ok "the line says why" || bad "dense: $(head -1 "$T/err")"

finish
