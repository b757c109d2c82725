#!/bin/sh
# sr_contract.sh: one stochastic-rounding contract across identities, steps
# and expert shards (docs/numerics.md, "Stochastic rounding"), checked with
# `quant` on dumps whose bytes the independent oracle rounded:
#   tied weights   two module paths, one Parameter: with sr_salt = its
#                  identity both reproduce the one set of bytes; the legacy
#                  path-derived salt fails the second path;
#   replay         bytes rounded at step N reproduce under sr_step N, not
#                  under N-1 (nor under the old fixed step 0);
#   expert shards  each EP rank's experts reproduce the whole stacked
#                  weight's rounding under their global sr_expert, not under
#                  their local index;
#   refusals       a malformed sr_* key, or one without rounding sr, exits 2;
#   qatdump        writes sr_salt = the weight Parameter's name (a tied
#                  weight's sites share it; tests/e2e/qatdump_sr.py).
. "$(dirname "$0")/lib.inc"
$PY -c "import ml_dtypes, h5py" 2>/dev/null || { echo "skip: ml_dtypes or h5py missing for $PY"; exit 77; }
MK="$PY scripts/make_sr_dump.py"
Q="$QATCHECK quant"
for fmt in fp8_channel fp8_block128_ue8m0; do
  $MK "$T/tied.h5" tied --format $fmt --step 3 || bad "make tied $fmt"
  expect_exit 0 "$fmt: a tied weight at two paths reproduces one rounding (sr_salt = its identity)" $Q --dump "$T/tied.h5"
  [ "$(grep -c ' reproduced ' "$T/out")" -eq 2 ] || bad "$fmt tied: expected both paths reproduced: $(cat "$T/out")"
  $MK "$T/leg.h5" tied --legacy --format $fmt --step 3 || bad "make tied legacy $fmt"
  expect_exit 1 "$fmt: the legacy path-derived salt gives the second path other masks" $Q --dump "$T/leg.h5" --json "$T/leg.json"
  $PY - "$T/leg.json" <<'PYEOF' || bad "$fmt legacy: not the second path alone"
import json, sys
r = json.load(open(sys.argv[1]))
bad = [c["module"] for c in r["checks"] if c["result"] != "reproduced"]
assert bad == ["/model.layers.1.attn.q_proj"], bad
PYEOF
done

$MK "$T/r5.h5" replay --step 5 || bad "make replay"
expect_exit 0 "replay at step 5 reproduces the dumped bytes" $Q --dump "$T/r5.h5" --module /lin
$MK "$T/r4.h5" replay --step 5 --contract-step 4 || bad "make replay step 4"
expect_exit 1 "step 4's contract does not reproduce step 5's bytes" $Q --dump "$T/r4.h5" --module /lin
grep -q "payload\[" "$T/out" || bad "step 4: the mismatching payload is not shown"
$MK "$T/big.h5" replay --step 4294967295 || bad "make replay at the last step"
expect_exit 0 "step 2^32-1 (the counter's whole word) reproduces" $Q --dump "$T/big.h5" --module /lin

$MK "$T/whole.h5" experts || bad "make experts whole"
expect_exit 0 "four experts in one file reproduce (sr_expert 0..3)" $Q --dump "$T/whole.h5"
for r in 0 1; do
  $MK "$T/ep$r.h5" experts --ep-rank $r --ep-size 2 || bad "make ep rank $r"
  expect_exit 0 "EP rank $r of 2: its experts reproduce under their global ids" $Q --dump "$T/ep$r.h5"
done
$PY - "$T" <<'PYEOF' || bad "the EP shards' bytes are not the whole file's"
import sys, h5py, numpy as np
t = sys.argv[1]
w = h5py.File(t + "/whole.h5", "r")
for r in (0, 1):
    s = h5py.File(t + "/ep%d.h5" % r, "r")
    for local in (0, 1):
        p = "model.layers.0.mlp.experts.%d.down_proj/saved/weight_q"
        assert np.array_equal(s[p % local][...], w[p % (2 * r + local)][...]), (r, local)
PYEOF
$MK "$T/eploc.h5" experts --ep-rank 1 --ep-size 2 --expert-id local || bad "make ep local ids"
expect_exit 1 "EP rank 1 with local expert ids draws other masks" $Q --dump "$T/eploc.h5"

# refusals: named, exit 2
$PY - "$T/r5.h5" "$T" <<'PYEOF' || bad "make refusal dumps"
import json, shutil, sys, h5py
src, t = sys.argv[1], sys.argv[2]
bad = {"rn_step": {"weight_format": "fp8_channel", "sr_step": 3},
       "frac_step": {"weight_format": "fp8_channel", "rounding": {"sr": {"seed": 1}}, "sr_step": 2.5},
       "neg_expert": {"weight_format": "fp8_channel", "rounding": {"sr": {"seed": 1}}, "sr_expert": -1},
       "num_salt": {"weight_format": "fp8_channel", "rounding": {"sr": {"seed": 1}}, "sr_salt": 12}}
for name, c in bad.items():
    shutil.copy(src, "%s/%s.h5" % (t, name))
    with h5py.File("%s/%s.h5" % (t, name), "r+") as f:
        f["lin"].attrs["contract"] = json.dumps(c)
PYEOF
for c in "rn_step:sr_step" "frac_step:sr_step" "neg_expert:sr_expert" "num_salt:sr_salt"; do
  f=${c%%:*}; k=${c#*:}
  expect_exit 2 "$f: refused" $Q --dump "$T/$f.h5" --module /lin
  grep -q "qatcheck: error: module '/lin': contract key '$k'" "$T/err" || bad "$f: the message does not name /lin and $k: $(cat "$T/err")"
done
if have_py "$PY" torch; then
  $PY tests/e2e/qatdump_sr.py "$T" >"$T/out" 2>&1 && ok "qatdump: sr_salt from named_parameters (tied sites share it)" \
    || { bad "qatdump sr_salt"; tail -5 "$T/out"; }
else
  echo "skip: no torch for the qatdump part"
fi
finish
