#!/bin/sh
# threads_same.sh: a host reference gives the same values at any thread
# count. The shipped cases of the classes whose host loops run on
# qc_par_for's threads (a row, an element, a channel, an SSD head, a vocab
# shard or an expert a piece), each at 1 thread and at 3: the same exit and
# the JSON reports' checks the same field for field (every metric at full
# precision). A sum that followed the pieces, not the one loop's order,
# moves metrics in their last digits and fails here.
. "$(dirname "$0")/lib.inc"
for c in ssd ssd_groups ssd_init conv1d rope rope_interleaved gelu swiglu relu2 rmsnorm layernorm logprob moe_swiglu attention_gqa; do
  [ -f "cases/$c.json" ] || { bad "cases/$c.json is missing"; continue; }
  for n in 1 3; do
    QATCHECK_THREADS=$n "$QATCHECK" vjp --case "cases/$c.json" --json "$T/$c.$n.json" --quiet >/dev/null 2>"$T/err.$n"
    echo $? >"$T/rc.$n"
  done
  if [ "$(cat "$T/rc.1")" != "$(cat "$T/rc.3")" ]; then
    bad "$c: exit $(cat "$T/rc.1") at 1 thread, $(cat "$T/rc.3") at 3 ($(head -1 "$T/err.3"))"
    continue
  fi
  if diff=$($PY - "$T/$c.1.json" "$T/$c.3.json" <<'P'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ca, cb = a.get("checks"), b.get("checks")
if not ca or len(ca) != len(cb or []):
    print("no checks, or not as many: %s against %s" % (len(ca or []), len(cb or []))); sys.exit(1)
def first(x, y, path=""):  # the first field that differs, by its path
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            d = first(x.get(k), y.get(k), path + "/" + k)
            if d: return d
        return None
    return None if x == y else "%s %r against %r" % (path, x, y)
for x, y in zip(ca, cb):
    d = first(x, y)
    if d:
        print("%s %s %s: %s" % (x.get("module"), x.get("dy"), x.get("tensor"), d))
        sys.exit(1)
P
); then ok "$c: the same $(cat "$T/rc.1" | sed 's/^/exit /') and checks at 1 and 3 threads"
  else bad "$c: the checks differ between 1 and 3 threads: $diff"; fi
done
finish
