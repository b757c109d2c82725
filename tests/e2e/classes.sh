#!/bin/sh
# classes.sh: `qatcheck classes [--json]` prints every class of the class
# table from its row: the JSON names the classes `vjp --help` lists, in its
# order, each with its tensors by role, its gradients (the class row's
# `grads`: every word is a gradient a case may declare, and a tolerance for
# a name outside them is refused), its contract keys with their defaults
# (the defaults a generated case runs under), `fd` as `fd --help` lists the
# classes, and its coverage items; the text names every class and key; a
# bad option exits 2 with one line and prints nothing on stdout.
. "$(dirname "$0")/lib.inc"
expect_exit 0 "classes --json" "$QATCHECK" classes --json
cp "$T/out" "$T/c.json"
expect_exit 0 "classes (text)" "$QATCHECK" classes
cp "$T/out" "$T/c.txt"
"$QATCHECK" vjp --help >"$T/vjp.txt" 2>&1
"$QATCHECK" fd --help >"$T/fd.txt" 2>&1
$PY - "$T/c.json" "$T/c.txt" "$T/vjp.txt" "$T/fd.txt" <<'P' || bad "the listing does not match the class rows"
import json, re, sys
d = json.load(open(sys.argv[1]))
txt, vjp, fd = (open(p).read() for p in sys.argv[2:5])
cls = d["classes"]
names = [c["name"] for c in cls]
# vjp --help lists the classes after "module classes:", "  name  summary"
listed = re.findall(r"^  ([a-z0-9_]+) +\S", vjp.split("module classes:")[1], re.M)
assert names == listed, (names, listed)
fd_listed = fd.split("one of:")[1].split("\n")[0].split()
assert [c["name"] for c in cls if c["fd"]] == fd_listed, fd_listed
assert [k["key"] for k in d["common_keys"]] == ["compute_dtype"], d["common_keys"]
for c in cls:
    for m in ("summary", "shape_help", "not_checked"):
        assert isinstance(c[m], str), (c["name"], m)
    assert c["summary"] and c["grads"] and c["outputs"] == ["y"], c["name"]
    assert all(g.startswith("d_") for g in c["grads"]), c
    # each gradient is d_<a modelled input or param>
    for g in c["grads"]:
        assert g[2:] in c["inputs"] + c["params"], (c["name"], g)
    for k in c["keys"]:
        assert set(k) == {"key", "values", "default", "help"}, k
        assert k["values"] is None or k["default"] in k["values"] or k["default"] == "", k
    for v in c["coverage"]:
        assert v["item"] and v["label"] and v["how"], v
    assert c["hypotheses"], c["name"]
    assert re.search(r"^%s: " % re.escape(c["name"]), txt, re.M), c["name"]
    for k in c["keys"]:
        assert (" %s = %s " % (k["key"], k["default"])) in txt, k
by = {c["name"]: c for c in cls}
assert by["linear"]["grads"] == ["d_x", "d_weight", "d_bias"], by["linear"]
assert by["linear"]["params"] == ["weight", "bias"] and "weight_q" in by["linear"]["saved"], by["linear"]
assert by["linear"]["fast_path"] and by["linear"]["reference_forward"] and not by["linear"]["fd"], by["linear"]
assert {k["key"]: k["default"] for k in by["linear"]["keys"]}["weight_format"] == "none"
assert "{clipped}" in [k for k in by["linear"]["keys"] if k["key"] == "ste"][0]["values"]
assert [k for k in by["rmsnorm"]["keys"] if k["key"] == "eps"][0]["values"] is None
assert "moe_shared" in [v["item"] for v in by["moe"]["coverage"]], by["moe"]["coverage"]
assert by["linear"]["split"] and by["rmsnorm"]["split"] is None
assert "compute_dtype = float32" in txt
P
[ -s "$T/c.json" ] && ok "the JSON and the text describe every class" || bad "no JSON"

# every gradient the JSON lists is one a case may declare, and a name
# outside them is refused: the listing is the case parser's own list
$PY - "$T/c.json" "$T" <<'P' || bad "cannot write the gradient cases"
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["classes"]:
    tol = {g: {"rel_l2": 1e-3, "reasoning": "listing"} for g in c["grads"]}
    data = {"dump": "missing.h5"}  # the tolerances are read before the data is opened
    json.dump({"module": c["name"], "data": data, "tolerances": {c["name"]: tol}},
              open("%s/ok.%s.json" % (sys.argv[2], c["name"]), "w"))
    tol["d_zz"] = {"rel_l2": 1e-3, "reasoning": "not a gradient of the class"}
    json.dump({"module": c["name"], "data": data, "tolerances": {c["name"]: tol}},
              open("%s/bad.%s.json" % (sys.argv[2], c["name"]), "w"))
P
for c in $($PY -c 'import json,sys; print(" ".join(c["name"] for c in json.load(open(sys.argv[1]))["classes"]))' "$T/c.json"); do
  # a missing dump: exit 2 either way; the message says whether the tolerances passed
  "$QATCHECK" vjp --case "$T/ok.$c.json" >/dev/null 2>"$T/err"
  grep -q "missing.h5" "$T/err" || bad "$c: the listed gradients are not all taken: $(cat "$T/err")"
  "$QATCHECK" vjp --case "$T/bad.$c.json" >/dev/null 2>"$T/err"
  grep -q "d_zz" "$T/err" || bad "$c: a name outside the listed gradients is not refused: $(cat "$T/err")"
done
ok "the listed gradients are the case parser's"

expect_exit 2 "classes --bogus" "$QATCHECK" classes --bogus
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "unknown option '--bogus'" "$T/err" || bad "--bogus: $(cat "$T/err")"
[ -s "$T/out" ] && bad "--bogus printed on stdout"
(cd "$T" && expect_exit 2 "classes --json=x (a flag takes no value)" "$QATCHECK" classes --json=x)
expect_exit 0 "classes --help" "$QATCHECK" classes --help
grep -q "usage: qatcheck classes" "$T/out" || bad "--help: $(cat "$T/out")"
"$QATCHECK" --help | grep -q "^  classes " && ok "qatcheck --help lists classes" || bad "qatcheck --help does not list classes"
finish
