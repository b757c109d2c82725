#!/bin/sh
# attention_saved.sh: an attention autograd Function that saves q, k, v
# beside O and the LSE and names them with qatcheck_saved
# (tests/e2e/attention_saved.py, through scripts/qatdump.py). A saved copy
# of an input (saved/<input> or saved/<input>_saved) is recognised and
# compared with the input: exact copies pass, a bf16 copy of a float32
# input passes (and a float8 one, with torch 2), a stale k (another step's,
# which the backward read) fails naming saved/k_saved, as does a bf16 copy
# one step off at one element; None in qatcheck_saved leaves that position
# out of the dump, which passes; an unknown saved name is still refused
# (exit 2). Skips (77) without torch or h5py.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py || { echo "skip: torch or h5py missing for $PY"; exit 77; }
$PY tests/e2e/attention_saved.py "$T" || exit 1
DER='{"d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}}'
mk() { # mk NAME DUMP GROUP: $T/NAME.json judging the dump's /attn_GROUP with its own gradients
  cat >"$T/$1.json" <<J
{"module": "attention", "data": {"dump": "$2", "modules": "^/attn_$3\$"}, "candidate": "dump", "tolerances": $DER}
J
}
mk exact d.h5 exact; mk stale d.h5 stale; mk none d.h5 none; mk bf16o d.h5 bf16o
mk bf16 bf16.h5 exact; mk bf16bad bf16bad.h5 exact; mk unk unk.h5 exact
expect_exit 0 "attention saved q, k, v: exact copies pass" "$QATCHECK" vjp --case "$T/exact.json" --quiet
expect_exit 0 "attention saved q, k, v with O in bf16: passes (saved_out_dtype recorded by the dumper)" \
  "$QATCHECK" vjp --case "$T/bf16o.json" --quiet
expect_exit 0 "attention saved k as its bf16 rounding: passes" "$QATCHECK" vjp --case "$T/bf16.json" --quiet
expect_exit 0 "attention qatcheck_saved None for q, k, v: dumped without them, passes" "$QATCHECK" vjp --case "$T/none.json" --quiet
expect_exit 1 "attention saved k stale: fails" "$QATCHECK" vjp --case "$T/stale.json" --json "$T/stale.r.json"
expect_exit 1 "attention saved bf16 k one step off: fails" "$QATCHECK" vjp --case "$T/bf16bad.json" --json "$T/bf16bad.r.json"
$PY - "$T/stale.r.json" "$T/bf16bad.r.json" <<'P' || bad "attention saved k: the failed check does not name saved/k_saved"
import json, sys
for path, n in zip(sys.argv[1:], ("768 of 768", "1 of 768")):
    r = json.load(open(path))
    k = [c for c in r["checks"] if c["tensor"] == "saved/k_saved"]
    assert len(k) == 1 and k[0]["verdict"] == "fail", k
    assert k[0]["why"].startswith("saved/k_saved is not a copy of inputs/k: " + n), k[0]["why"]
    ok = {c["tensor"] for c in r["checks"] if c["verdict"] == "pass"}
    assert {"y", "saved/out", "saved/lse"} <= ok, ok  # the forward ran on the step's k
print("saved/k_saved named")
P
expect_exit 2 "attention saved tensor of an unknown name: refused" "$QATCHECK" vjp --case "$T/unk.json"
grep -q "dataset 'saved/scores' is not modelled" "$T/err" || bad "the refusal does not name saved/scores: $(cat "$T/err")"
# a float8 copy (torch 2's float8_e4m3fn through the dumper's writer)
if have_torch2; then
  $PY2 - "$T" <<'P' || bad "the float8 copies were not written"
import shutil, sys
import h5py, torch
sys.path.insert(0, "scripts")
import qatdump
t = sys.argv[1]
for name, off in (("fp8", 0), ("fp8bad", 1)):
    shutil.copy(t + "/d.h5", "%s/%s.h5" % (t, name))
    with h5py.File("%s/%s.h5" % (t, name), "r+") as f:
        g = f["attn_exact/saved"]
        k = torch.from_numpy(g["k_saved"][()]).to(torch.float8_e4m3fn)
        del g["k_saved"]
        if off:
            k.view(torch.uint8).view(-1)[5] += 1
        qatdump.write_tensor(g, "k_saved", k)
P
  mk fp8 fp8.h5 exact; mk fp8bad fp8bad.h5 exact
  expect_exit 0 "attention saved k as its float8 e4m3 rounding: passes" "$QATCHECK" vjp --case "$T/fp8.json" --quiet
  expect_exit 1 "attention saved float8 k one step off: fails" "$QATCHECK" vjp --case "$T/fp8bad.json" --quiet
else
  echo "skip: the float8 copy (torch 2 missing)"
fi
finish
