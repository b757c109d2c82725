#!/bin/sh
# diagnose.sh: every failed check says what the bug is. One planted defect
# per diagnosis hypothesis (scripts/make_diag_dump.py), the defects of
# scripts/make_linear_dump.py (with more tokens than out-features, so a
# wrong weight is identifiable) and of scripts/make_class_dump.py: the
# report's first consistent hypothesis names the planted cause, stdout
# prints it, and no check that passed carries a diagnosis. Tolerances are
# derived ({"derive": true}).
. "$(dirname "$0")/lib.inc"
DER='"tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}, "d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}, "d_gate": {"derive": true}, "d_up": {"derive": true}, "d_logits": {"derive": true}}'
$PY scripts/make_diag_dump.py "$T/dd.h5" || exit 1
$PY scripts/make_linear_dump.py "$T/ld.h5" --defects all --m 96 || exit 1
$PY scripts/make_class_dump.py "$T/cd.h5" || exit 1
for d in dd ld cd; do
  echo "{\"data\": {\"dump\": \"$d.h5\", \"modules\": \"^/(ok|model|defect)\"}, \"candidate\": \"dump\", $DER}" >"$T/$d.json"
  expect_exit 1 "$d: the planted defects fail" "$QATCHECK" vjp --case "$T/$d.json" --json "$T/$d.r.json"
  cp "$T/out" "$T/$d.out"
done
# module:tensor:dy = the first consistent hypothesis and a word its text must hold
$PY - "$T" <<'P' || bad "a diagnosis does not name its planted cause"
import json, sys
T = sys.argv[1]
want = {
  "dd": {("/defect.doubled", "d_weight"): ("factor", "= 2:"),
         ("/defect.halved", "d_x"): ("factor", "= 1/2:"),
         ("/defect.mlp.experts.1.down_proj", "d_weight"): ("factor", "= 1/8:"),
         ("/defect.sign", "d_x"): ("sign", "sign flip"),
         ("/defect.transposed_dw", "d_weight"): ("transpose", "transposed"),
         ("/defect.shifted_rows", "d_x"): ("rows", "shifted by +2"),
         ("/defect.permuted_rows", "d_x"): ("rows", "permuted"),
         ("/defect.dx_master", "d_x"): ("dx_convention", "dx_weight = dequant"),
         ("/defect.weight_t", "d_x"): ("weight_transposed", "W^T"),
         ("/defect.stale_weight", "d_x"): ("other_weight", "another weight"),
         ("/defect.dy_fp8", "d_x"): ("dy_precision", "float8_e4m3fn"),
         ("/defect.dy_fp8", "d_weight"): ("dy_precision", "false difference"),
         ("/defect.frozen_zero", "d_weight"): ("zero", "marked frozen"),
         ("/defect.cut_dx", "d_x"): ("zero", "never reached"),
         ("/defect.nan", "d_x"): ("nonfinite", "[50, 7]"),
         ("/defect.attention_head", "d_q"): ("slice", "dimension 1"),
         },
  "ld": {("/defect.wrong_weight", "d_x"): ("other_weight", "rel_l2 0.0"),
         ("/defect.transposed_dw", "d_weight"): ("transpose", "transposed"),
         ("/defect.shifted_rows", "d_x"): ("rows", "shifted by +1"),
         ("/defect.scaled_dw", "d_weight"): ("factor", "k = 1.00"),
         ("/defect.nan", "d_x"): ("nonfinite", "non-finite"),
         ("/defect.missing_bias", "d_bias"): (None, "has no d_bias"),
         },
  "cd": {("/defect.rmsnorm_no_mean", "d_x"): ("no_projection_term", "mean(g xh)"),
         ("/defect.swiglu_clamp_pass", "d_up"): ("clamp_ignored", "outside the clamp"),
         ("/defect.logprob_count", "d_logits"): ("factor", "counted tokens"),
         ("/defect.router_ids", "d_logits"): ("reselected_ids", "selections differ"),
         ("/defect.attention_lse_log2", "d_q"): ("lse_base", "base-2 LSE"),
         ("/defect.attention_lse_log2", "d_k"): ("lse_base", "base-2 LSE"),
         ("/defect.attention_lse_log2", "d_v"): ("lse_base", "base-2 LSE"),
         },
}
bad = 0
for d, w in want.items():
    r = json.load(open("%s/%s.r.json" % (T, d)))
    out = open("%s/%s.out" % (T, d)).read()
    failed = {}
    for c in r["checks"]:
        diag = c.get("diagnosis")
        if c["verdict"] == "pass":
            if diag: print("FAIL %s: %s %s passed but carries a diagnosis" % (d, c["module"], c["tensor"])); bad += 1
            continue
        if not c["module"].startswith("/defect."):
            print("FAIL %s: correct module %s %s failed: %s" % (d, c["module"], c["tensor"], c["why"])); bad += 1
            continue
        if not diag:
            print("FAIL %s: %s %s failed without a diagnosis" % (d, c["module"], c["tensor"])); bad += 1
            continue
        failed.setdefault((c["module"], c["tensor"]), []).append(c)
    for key, (name, word) in w.items():
        checks = failed.get(key)
        if not checks:
            print("FAIL %s: %s %s did not fail" % (d, key[0], key[1])); bad += 1
            continue
        ok = False
        for c in checks:
            s = c["diagnosis"]["summary"]
            first = [h["name"] for h in c["diagnosis"]["hypotheses"] if h["consistent"]]
            if (name is None or (first and first[0] == name)) and word in s:
                ok = True
        if not ok:
            print("FAIL %s: %s %s: expected %s (%r), got %s" % (d, key[0], key[1], name, word,
                  [c["diagnosis"]["summary"][:200] for c in checks])); bad += 1
        elif not any(key[0] in line and word.split()[0] in line for line in out.splitlines() if line.startswith(key[0])):
            print("FAIL %s: stdout does not print the diagnosis of %s %s" % (d, key[0], key[1])); bad += 1
    print("%s: %d planted causes named" % (d, len(w)))
sys.exit(1 if bad else 0)
P
# one process (no world_size > 1): no rank, all-reduce or DP scaling is offered;
# the same dump marked as one of 8 processes' gets the expert-DP reading
grep -E "^/defect\.(doubled|halved|mlp\.experts\.1)" "$T/dd.out" | grep -qiE "rank|all-reduce|data-parallel|expert-DP" \
  && bad "a single-process dump's factor names a data-parallel cause" || ok "a single-process factor names no data-parallel cause"
$PY - "$T/dd.h5" <<'P' || bad "could not mark the dump world_size 8"
import sys, h5py
h5py.File(sys.argv[1], "a").attrs["world_size"] = 8
P
"$QATCHECK" vjp --case "$T/dd.json" >"$T/dd8.out" 2>&1
grep "^/defect.mlp.experts.1.down_proj" "$T/dd8.out" | grep -q "expert-DP" \
  && ok "a dump of 8 processes names the expert-DP scaling" || bad "world_size 8: no expert-DP reading of the 1/8 factor"
# Issue 38: the fit is made against the reference variant the check is
# judged against, and one stale 128 x 128 block scale is named as that
# block. An autocast linear (float32 tensors; X, W and dY cast to bf16
# inside, float32 out) with d_x planted x 1.001: no variant passes it, it
# is judged against the variant the correct backward matches (its own ok
# twin passes against it), and the factor reads 1.001 to 1e-4 (against
# the exact reference it read 1.0018). An fp8_block128 weight (256 x 256,
# 4 blocks, exact in e4m3 x a float32 block scale) whose block (1, 0)
# was dequantized with a stale scale (x 1.004) in d_x: named as that block
# with its k, not a global factor.
$PY - "$T/vb.h5" <<'P' || exit 1
import json, sys
import h5py
import ml_dtypes
import numpy as np
F = np.float32
rng = np.random.default_rng(38)
def bf(a):
    return np.asarray(a, F).astype(ml_dtypes.bfloat16).astype(F)
def module(f, path, contract, x, w, b, dy, gr):
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"], g["params/weight"], g["params/bias"], g["grad_out/dy"] = x, w, b, dy
    for k, v in gr.items():
        g["grads/dy/" + k] = np.asarray(v, F)
def grads(x, w, dy):
    X, W, G = (np.asarray(a, np.float64) for a in (x, w, dy))
    return {"d_x": G @ W, "d_weight": G.T @ X, "d_bias": G.sum(0)}
M, K, N = 96, 256, 192
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    nc = {"weight_format": "none", "dx_weight": "master"}
    x, w, b, dy = (rng.standard_normal(s).astype(F) for s in ((M, K), (N, K), (N,), (M, N)))
    w /= 16
    ac = grads(bf(x), bf(w), bf(dy))  # autocast: the operands cast to bf16, float32 accumulate and out
    module(f, "/ok.autocast", nc, x, w, b, dy, ac)
    module(f, "/defect.autocast_dx", nc, x, w, b, dy, dict(ac, d_x=ac["d_x"] * 1.001))
    q = rng.standard_normal((256, 256)).astype(ml_dtypes.float8_e4m3fn).astype(F)
    q[0, 0] = q[0, 128] = q[128, 0] = q[128, 128] = 448.0
    s = np.array([[0.0625 * 1.5, 0.125], [0.0625 * 1.25, 0.03125 * 1.75]], F)
    W8 = (q * np.kron(s, np.ones((128, 128), F))).astype(F)
    x8, dy8, b8 = bf(rng.standard_normal((M, 256))), bf(rng.standard_normal((M, 256))), bf(rng.standard_normal(256))
    Ws = W8.copy()
    Ws[128:, :128] *= F(1.004)
    module(f, "/defect.block_stale", {"weight_format": "fp8_block128", "dx_weight": "dequant"}, x8, W8, b8, dy8,
           dict(grads(x8, W8, dy8), d_x=grads(x8, Ws, dy8)["d_x"]))
P
echo "{\"data\": {\"dump\": \"vb.h5\"}, \"candidate\": \"dump\", $DER}" >"$T/vb.json"
expect_exit 1 "vb: the planted defects fail" "$QATCHECK" vjp --case "$T/vb.json" --json "$T/vb.r.json"
$PY - "$T/vb.r.json" <<'P' || bad "the variant's factor or the stale block is not named"
import json, re, sys
r = json.load(open(sys.argv[1]))
ck = {(c["module"], c["tensor"]): c for c in r["checks"]}
bad = [k for k, c in ck.items() if c["verdict"] != "pass" and k not in (("/defect.autocast_dx", "d_x"), ("/defect.block_stale", "d_x"))]
assert not bad, "unexpected failures: %s" % bad
c = ck[("/defect.autocast_dx", "d_x")]
s = c["diagnosis"]["summary"]
m = re.search(r"constant factor k = ([0-9.]+)", s)
assert c["verdict"] == "fail" and m and abs(float(m.group(1)) - 1.001) <= 1e-4, s
assert "dY" in (c.get("reference_variant") or ""), c.get("reference_variant")
print("ok   autocast d_x x 1.001: %s, judged against %s" % (m.group(0), c["reference_variant"]))
c = ck[("/defect.block_stale", "d_x")]
s = c["diagnosis"]["summary"]
first = [h["name"] for h in c["diagnosis"]["hypotheses"] if h["consistent"]]
m = re.search(r"block \(1, 0\) of 128 x 128 of the weight scaled by k = ([0-9.]+)", s)
assert c["verdict"] == "fail" and first and first[0] == "block_scale" and m and abs(float(m.group(1)) - 1.004) <= 1e-4, s
assert "constant factor" not in s, s
print("ok   stale block: %s" % s[:120])
P
# a check that fails for no known reason says so, listing what it tested
grep -q "no known signature (tested:" "$T/ld.out" && ok "an unexplained failure says 'no known signature'" \
  || bad "no 'no known signature' line for the sparse-dY wrong weight"
finish
