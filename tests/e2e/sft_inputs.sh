#!/bin/sh
# sft_inputs.sh: every log format as its real writer makes it, and bad
# input. scripts/proxy_sft.py writes each arm's log as JSONL (json), CSV
# (csv), TensorBoard events (the tensorboard package's writer: simple_value,
# and for native_baseline the one-element tensor form), trainer_state.json
# and Megatron golden values, its configs as JSON and YAML (PyYAML); each
# format read back must give the JSONL's values at the same steps (TensorBoard
# rounds to float32). Corrupt input exits 2 with one error line and no
# report: a flipped byte in an event file (its CRC), a truncated record, a
# log line without a step, a bound without reasoning, a step dump with an
# arm found twice or without its root attribute. A noise band from two more
# seeds of native_baseline. A metric missing in the
# window is inconclusive (exit 1), never a pass.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py yaml tensorboard || { echo "skip: python3 lacks torch, h5py, yaml or tensorboard"; exit 77; }
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null || bad "$1: not ($2)"; }
D="$T/run"
$PY scripts/proxy_sft.py --out "$D" --steps 12 --data-seed 5 --step-dump "$D/ut.h5,$D/ref.h5" >"$T/run.log" 2>&1 || { bad "proxy_sft.py"; cat "$T/run.log"; finish; }

# each format against the arm's own JSONL: the same values at the same steps
TB_TAGS='"tags": {"loss": "train/loss", "grad_norm": "train/grad_norm", "val_nll": "val/nll"}'
HF_TAGS='"tags": {"val_nll": "eval_loss"}'
MG_TAGS='"tags": {"loss": "lm loss", "grad_norm": "grad norm", "val_nll": "validation nll"}'
for arm in under_test native_baseline; do
  for f in csv tb hf megatron; do
    case $f in
      csv) log=metrics.csv; tags='"tags": {}'; tol='"pointwise_abs": 0' ;;
      tb) log=tb; tags=$TB_TAGS; tol='"pointwise_rel": 1.2e-7' ;;
      hf) log=trainer_state.json; tags=$HF_TAGS; tol='"pointwise_abs": 0' ;;
      megatron) log=golden_values.json; tags=$MG_TAGS; tol='"pointwise_abs": 0' ;;
    esac
    chk="{$tol, \"reasoning\": \"the same numbers in another format ($f)\"}"
    cat >"$D/fmt.json" <<J
{"arms": {"jsonl": {"log": "$arm/metrics.jsonl"}, "$f": {"log": "$arm/$log", $tags}},
 "window": [1, 12], "pairs": {"jsonl~$f": {"loss": $chk, "grad_norm": $chk, "val_nll": $chk}}}
J
    rm -f "$T/fmt.r.json"
    "$QATCHECK" sft --case "$D/fmt.json" --json "$T/fmt.r.json" >"$T/out" 2>"$T/err"
    # no configs: the pair is inconclusive by rule, but every check passes on all 12 (2) points
    json_is "$T/fmt.r.json" "all(m['verdict'] == 'pass' and m['points'] == (2 if m['metric'] == 'val_nll' else 12) for m in r['pairs'][0]['metrics']) and r['arms'][1]['format'] == {'csv': 'csv', 'tb': 'tfevents', 'hf': 'hf_trainer_state', 'megatron': 'megatron'}['$f']"
    grep -q "has no config" "$T/fmt.r.json" || bad "$arm $f: an arm without a config is not named"
  done
done
ok "csv, tb (simple_value and tensor), hf, megatron read as their writers wrote them"

# the committed case on this run (window shortened): configs in JSON and YAML, three formats
$PY - cases/proxy/sft.json "$D/sft.json" <<'P'
import json, sys
c = json.load(open(sys.argv[1]))
c["window"] = [1, 12]
for p in c["pairs"].values():
    for k in p:
        if "mean_rel" in k or "equivalence" in k or k["metric"] == "val_nll":
            k["window"] = [1, 12]
json.dump(c, open(sys.argv[2], "w"))
P
expect_exit 0 "the three arms in JSONL, CSV and TensorBoard with JSON and YAML configs" "$QATCHECK" sft --case "$D/sft.json" --json "$T/r.json"
json_is "$T/r.json" "[row['key'] for row in r['config_diff'] if row['differs']] == ['precision'] and next(x for x in r['config_diff'] if x['key'] == 'lr')['values']['native_baseline'] == 0.001"

# a noise band from two more runs of native_baseline with other initial seeds
for sd in 1 2; do
  $PY scripts/proxy_sft.py --out "$D/n$sd" --steps 12 --data-seed 5 --seed $sd --arms native_baseline --formats jsonl >/dev/null 2>&1 || bad "proxy_sft.py --seed $sd"
done
$PY - "$D/sft.json" "$D/noise.json" <<'P'
import json, sys
c = json.load(open(sys.argv[1]))
c["pairs"]["under_test~native_baseline"].append({"metric": "loss", "noise_arms": ["n1/native_baseline/metrics.jsonl", "n2/native_baseline/metrics.jsonl"],
    "noise_multiple": 3, "reasoning": "three times the spread of native_baseline over initial seeds"})
json.dump(c, open(sys.argv[2], "w"))
P
expect_exit 0 "a noise band from other seeds" "$QATCHECK" sft --case "$D/noise.json" --json "$T/noise.r.json"
json_is "$T/noise.r.json" "r['pairs'][1]['metrics'][-1]['verdict'] == 'pass' and r['pairs'][1]['metrics'][-1]['bounds']['noise_multiple'] == 3 and r['pairs'][1]['metrics'][-1]['points'] == 12"

# refusals: exit 2, one error line naming the problem, no report but the error report
refused() { # DESC NEEDLE ARGS...
  desc=$1; needle=$2; shift 2
  rm -f "$T/bad.json"
  expect_exit 2 "$desc" "$QATCHECK" "$@" --json "$T/bad.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: expected one error line: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q -- "$needle" || bad "$desc: the message does not name '$needle': $(cat "$T/err")"
  error_or_none "$T/bad.json" || bad "$desc: a refused run wrote a report other than its error report"
}
ev=$(ls "$D"/native_baseline/tb/events.out.tfevents.*)
cp -r "$D" "$T/c1"
$PY - "$T/c1/native_baseline/tb/$(basename "$ev")" <<'P'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[len(b) // 2] ^= 0x10; open(sys.argv[1], "wb").write(bytes(b))
P
refused "a flipped byte in an event file" "CRC" sft --case "$T/c1/sft.json"
cp -r "$D" "$T/c2"
head -c $(($(wc -c <"$ev") - 7)) "$ev" >"$T/c2/native_baseline/tb/$(basename "$ev")"
refused "a truncated event file" "truncated" sft --case "$T/c2/sft.json"
cp -r "$D" "$T/c3"
sed -i '5s/"step": 5, //' "$T/c3/under_test/metrics.jsonl"
refused "a JSONL line without a step" "line 5 has no step" sft --case "$T/c3/sft.json"
$PY -c "import json; c = json.load(open('$D/sft.json')); del c['pairs']['under_test~gradient_reference'][0]['reasoning']; json.dump(c, open('$D/c4.json', 'w'))"
refused "a bound without reasoning" "reasoning" sft --case "$D/c4.json"
refused "a log that is not there" "cannot open" sft --case "$T/c3/nope.json"
printf 'optimizer: [lr\n' >"$T/c3/native_baseline/config.yaml"
sed -i '5s/^{/{"step": 5, /' "$T/c3/under_test/metrics.jsonl"
refused "a config that is neither JSON nor YAML" "config.yaml" sft --case "$T/c3/sft.json"
refused "sft on a GPU" "not supported" sft --case "$D/sft.json" --device cuda
# a metric missing in the window: inconclusive, exit 1, never a pass
sed 's/"window": \[1, 12\]/"window": [1, 40]/g' "$D/sft.json" >"$D/long.json"
expect_exit 1 "a window longer than the logs is inconclusive" "$QATCHECK" sft --case "$D/long.json" --json "$T/long.r.json"
json_is "$T/long.r.json" "r['conclusion'] == 'inconclusive' and any('gap' in m['why'] and m['verdict'] == 'inconclusive' for p in r['pairs'] for m in p['metrics'])"

# step: the arms from two files; an arm found twice; a dump that is not one
cat >"$D/step2.json" <<J
{"dump": ["ut.h5", "ref.h5"], "tolerances": $(sed -n '/"tolerances"/,$p' cases/proxy/step.json | sed '1s/.*"tolerances": //' | sed '$d')}
J
expect_exit 0 "step: the arms from two files" "$QATCHECK" step --case "$D/step2.json" --json "$T/s2.json"
json_is "$T/s2.json" "len(r['arms']) == 2 and r['arms'][0]['arm'] == 'under_test' and r['arms'][1]['file'].endswith('ref.h5')"
sed 's/"ref.h5"\]/"ref.h5", "ut2.h5"]/' "$D/step2.json" >"$D/step3.json"
cp "$D/ut.h5" "$D/ut2.h5"
refused "step: an arm group found twice" "found twice" step --case "$D/step3.json"
sed 's/"ut.h5", "ref.h5"/"sft.json"/' "$D/step2.json" >"$D/step4.json"
refused "step: a dump that is not HDF5" "not an HDF5 file" step --case "$D/step4.json"
$PY -c "import h5py; f = h5py.File('$D/ut.h5', 'a'); del f.attrs['qatcheck_step']"
refused "step: no qatcheck_step attribute" "qatcheck_step" step --case "$D/step2.json"
finish
