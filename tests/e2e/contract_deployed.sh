#!/bin/sh
# contract_deployed.sh: layer 2 under each layer's own deployed format
# (docs/contract.md, "Each layer's deployed format"). From one mixed
# checkpoint (scripts/make_mixed_checkpoint.py: attention fp8_block128, MLP
# nvfp4, lm_head and the router gate unquantized), without --weight-format:
# - a safetensors master with a compressed-tensors quantization_config, and
#   the same with a transformers fp8 config (modules_to_not_convert), run
#   each layer under its own format; unquantized layers are rows with
#   weight_format none and an exact dX (cosine 1, rel_l2 0), not skipped;
# - --activation-format none,fp8_token crosses: every row carries its
#   layer's weight format and one declared activation format;
# - an HDF5 dump whose modules' contracts declare the formats does the same,
#   and scripts/contract_check.py recomputes every row independently;
# - --dy takes every module's dY from the dump's batch (the report says
#   dy_source dump, rows equal the --dump run's); a dump lacking a module's
#   batch is refused (no generated dY beside real ones).
set -u
. "$(dirname "$0")/lib.inc"
"$PY" -c "import safetensors, h5py" 2>/dev/null || { echo "skip: safetensors or h5py missing for $PY"; exit 77; }
"$PY" scripts/make_mixed_checkpoint.py "$T/m" || { bad "make_mixed_checkpoint"; finish; }
C="$QATCHECK contract --master-vs-dequant"
AF=none,fp8_token

# the checkpoint's rows: each layer's format, crossed with the activations
check_rows() { # REPORT WHAT
  "$PY" - "$1" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
want = lambda m: "none" if m.endswith(("lm_head", "mlp.gate")) else "fp8_block128" if ".self_attn." in m else "nvfp4"
assert r["weight_formats"]["mode"] == "deployed", r["weight_formats"]
assert r["weight_formats"]["unquantized_units"] == 3, r["weight_formats"]
mods = {x["module"] for x in r["rows"]}
assert len(mods) == 11 and "/lm_head" in mods and "/model.layers.1.mlp.gate" in mods, sorted(mods)
combos = {}
for x in r["rows"]:
    assert x["weight_format"] == want(x["module"]), (x["module"], x["weight_format"])
    assert x["weight_format_source"], x
    combos.setdefault((x["module"], x["tensor"]), set()).add(x["activation_format"])
    if x["weight_format"] == "none" and x["tensor"] == "d_x":
        m = x["metrics"]
        assert m["rel_l2"] == 0 and m["cosine"] == 1 and m["norm_ratio"] == 1, x
    elif x["tensor"] == "d_x":
        assert x["metrics"]["rel_l2"] > 1e-3, x
for (m, t), a in combos.items():
    assert a == ({"none", "fp8_token"} if t == "d_x" else {"fp8_token"}), (m, t, a)
assert len(r["rows"]) == 11 * 3, len(r["rows"])
PYEOF
}
expect_exit 0 "compressed-tensors config: each layer's format" $C --checkpoint "$T/m/ct" --activation-format $AF --tokens 16 --json "$T/ct.json"
check_rows "$T/ct.json" && ok "compressed-tensors rows" || bad "compressed-tensors rows"
grep -q "config group 'attn'" "$T/ct.json" && grep -q "ignore 're:.\*mlp.gate\$'" "$T/ct.json" || bad "format sources not reported"
"$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["dy_source"]=="generated", r["dy_source"]' "$T/ct.json" \
  || bad "generated dY not stated"
expect_exit 0 "transformers fp8 config" $C --checkpoint "$T/m/fp8/model.safetensors" --tokens 16 --json "$T/fp8.json"
"$PY" - "$T/fp8.json" <<'PYEOF' && ok "fp8 config rows" || bad "fp8 config rows"
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["rows"]:
    w = "none" if x["module"].endswith(("lm_head", "mlp.gate")) else "fp8_block128"
    assert x["weight_format"] == w, (x["module"], x["weight_format"])
assert any("modules_to_not_convert 'mlp.gate'" in x["weight_format_source"] for x in r["rows"])
PYEOF

# the dump: each module's contract, every row recomputed independently
expect_exit 0 "dump with per-module contracts" $C --dump "$T/m/batch.h5" --activation-format $AF --json "$T/d.json"
check_rows "$T/d.json" && ok "dump rows" || bad "dump rows"
"$PY" scripts/contract_check.py "$T/m/batch.h5" "$T/d.json" --require nvfp4,fp8_block128,fp8_token >"$T/chk" 2>&1 \
  && ok "dump rows recomputed" || { cat "$T/chk"; bad "dump rows disagree with the independent check"; }

# --dy: the dump's real batch for every module
expect_exit 0 "checkpoint with --dy" $C --checkpoint "$T/m/ct" --dy "$T/m/batch.h5" --activation-format $AF --json "$T/dy.json"
"$PY" - "$T/dy.json" "$T/d.json" <<'PYEOF' && ok "--dy rows are the dump's" || bad "--dy rows"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["dy_source"] == "dump" and not a["generated"]["dy"], a["dy_source"]
assert all(x["dy"] == "dy" for x in a["rows"])
key = lambda x: (x["module"], x["tensor"], x["weight_format"], x["activation_format"])
mb = {key(x): x["metrics"] for x in b["rows"]}
assert len(mb) == len(a["rows"])
for x in a["rows"]:
    for k in ("cosine", "norm_ratio", "rel_l2"):
        assert x["metrics"][k] == mb[key(x)][k], (key(x), k)
PYEOF
expect_exit 2 "--dy lacking a module's batch" $C --checkpoint "$T/m/ct" --dy "$T/m/partial.h5" --json "$T/no.json"
grep -q "module '/model.layers.1.mlp.up_proj' of the checkpoint has no group in the dump" "$T/err" && error_or_none "$T/no.json" \
  && ok "the missing module named" || { cat "$T/err"; bad "the missing module not named"; }
expect_exit 0 "--modules leaves it out" $C --checkpoint "$T/m/ct" --dy "$T/m/partial.h5" --modules 'self_attn' --json "$T/p.json"

# --weight-format still sweeps every layer under each listed format
expect_exit 0 "--weight-format overrides" $C --checkpoint "$T/m/ct" --weight-format mxfp8 --tokens 16 --json "$T/w.json"
"$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["weight_formats"]["mode"]=="listed" and {x["weight_format"] for x in r["rows"]}=={"mxfp8"}' "$T/w.json" \
  && ok "listed formats" || bad "listed formats"
expect_exit 2 "--quant-config with --weight-format" $C --checkpoint "$T/m/ct" --weight-format mxfp8 --quant-config "$T/m/ct/config.json"
sed 's/"tensor_group"/"token"/' "$T/m/ct/config.json" >"$T/badcfg.json"
expect_exit 2 "a config group that fits no format" $C --checkpoint "$T/m/ct" --quant-config "$T/badcfg.json" --json "$T/bad.json"
grep -q "config group 'mlp' (module 'model.layers.0.mlp.down_proj') weights .* fit no qatcheck format" "$T/err" \
  && error_or_none "$T/bad.json" && ok "the group named" || { cat "$T/err"; bad "the bad group not named"; }
finish
