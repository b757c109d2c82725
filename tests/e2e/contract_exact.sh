#!/bin/sh
# contract_exact.sh: hand-checked cases of `qatcheck contract`.
#  - a weight exactly representable in a format (E4M3 grid values times a
#    power of two with each row, 32-group and 128-block holding +-448 x 2^-6;
#    E2M1 grid values times 2^-3 with each 16-block holding +-6 x 2^-3):
#    dequant(quant(W)) = W, so cosine 1, norm ratio 1, rel-L2 0;
#  - W = [[1, 0.3125]], dY = [[1]] under fp8_channel: s = fl(1/448),
#    0.3125 / s = 140 -> E4M3 144, 1 / s -> 448: g = [fl(448 s), fl(144 s)],
#    r = [1, 0.3125]; cosine, norm ratio and rel-L2 from those by hand.
set -u
. "$(dirname "$0")/lib.inc"
fail() { echo "FAIL: $*"; exit 1; }

"$PY" - "$T/x.h5" <<'PYEOF' || fail "cannot build the test dump"
import sys, h5py, numpy as np
rng = np.random.default_rng(1)
e4m3 = np.array(sorted({m * 2.0 ** e for e in range(-6, 9) for m in (1 + np.arange(8) / 8)} | {0.0}))
e4m3 = e4m3[e4m3 <= 448]
e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
def sign(n): return rng.choice([-1.0, 1.0], size=n)
w8 = (rng.choice(e4m3, size=(4, 256)) * sign((4, 256)).reshape(4, 256)) * 2.0 ** -6
w8[:, ::32] = 448 * 2.0 ** -6 * sign((4, 8))
w4 = (rng.choice(e2m1, size=(8, 64)) * sign((8, 64)).reshape(8, 64)) * 2.0 ** -3
w4[:, ::16] = 6 * 2.0 ** -3 * sign((8, 4))
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    for path, w in (("/exact.fp8", w8), ("/exact.fp4", w4), ("/hand", np.array([[1.0, 0.3125]]))):
        f.require_group(path).attrs["class"] = "linear"
        f[path + "/params/weight"] = w.astype(np.float32)
        f[path + "/grad_out/dy"] = (np.ones((1, 1)) if path == "/hand" else rng.standard_normal((5, w.shape[0]))).astype(np.float32)
PYEOF

run() {
  "$QATCHECK" contract --master-vs-dequant --dump "$T/x.h5" --quiet --json "$T/r.json" "$@" 2>"$T/err"
  rc=$?
  [ $rc -eq 0 ] || { cat "$T/err"; fail "$*: exit $rc"; }
}
exact() {
  "$PY" - "$T/r.json" "$1" <<'PYEOF' || fail "not exact: $1"
import json, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert len(r["rows"]) == n, len(r["rows"])
for x in r["rows"]:
    m = x["metrics"]
    assert m["rel_l2"] == 0 and abs(m["cosine"] - 1) <= 2e-16 and abs(m["norm_ratio"] - 1) <= 2e-16, (x["module"], x["weight_format"], m)
PYEOF
}
run --modules '^/exact\.fp8$' --weight-format none,fp8_tensor,fp8_channel,fp8_block128,mxfp8
exact 5
run --modules '^/exact\.fp4$' --weight-format none,nvfp4,mxfp4
exact 3
run --modules '^/hand$' --weight-format fp8_channel
"$PY" - "$T/r.json" <<'PYEOF' || fail "hand-checked fp8_channel row"
import json, math, sys
import numpy as np
f = np.float32
s = f(1) / f(448)
assert f(0.3125) / s == f(140)          # the hand computation's premise
g = [float(f(448) * s), float(f(144) * s)]
r = [1.0, 0.3125]
dot = g[0] * r[0] + g[1] * r[1]
ng, nr = math.hypot(*g), math.hypot(*r)
want = {"cosine": dot / (ng * nr), "norm_ratio": ng / nr, "rel_l2": math.hypot(g[0] - r[0], g[1] - r[1]) / nr}
m = json.load(open(sys.argv[1]))["rows"][0]["metrics"]
for k, v in want.items():
    assert abs(m[k] - v) <= 1e-12 * abs(v), (k, m[k], v)
assert abs(want["norm_ratio"] - 1.002575) < 1e-6   # (1 + (144/448)^2)^0.5 / (1 + 0.3125^2)^0.5
PYEOF
echo ok
