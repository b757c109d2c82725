#!/bin/sh
# sft_conventions.sh: the logs of real writers, each in its own convention,
# against one JSONL of the same run: every check passes at the steps the
# writer logged. Made here with the writers' documented formats and real
# packages: TensorBoard (torch.utils.tensorboard's SummaryWriter), a
# Hugging Face trainer_state.json (TrainerState's JSON: log_history entries
# with "step", train and eval entries), Megatron golden values (the dict form
# with "nan" placeholders for steps the run never logged, memory included;
# the older list form, positional, with a scalar iteration_timing_avg beside
# the metrics), LLaMA-Factory's trainer_log.jsonl (current_steps, text
# fields, a last line without loss), a W&B CSV export (Step and _step), and a
# JSONL with a key only the case names (step_key). Then the verdicts the
# placeholders must give: a resumed run against a full one passes over the
# steps both logged and is inconclusive (a gap, never a non-finite
# deviation) over the steps it did not; two resumed runs are not NaN vs
# NaN; a real NaN in a numeric log still deviates. Irregular logging
# (18, 47, 62, 63, ...) passes against itself and against a log of every
# step, and is a gap only over a real hole (or within a declared max_gap).
# gzip: logs read through it (several members, a Megatron file), a
# truncated one refused; a compressed case, step dump and safetensors
# checkpoint refused naming the file.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch tensorboard || { echo "skip: python3 lacks torch or tensorboard"; exit 77; }
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null || bad "$1: not ($2)"; }
D="$T/logs"
mkdir -p "$D"
$PY - "$D" <<'P' || bad "writing the logs"
import json, math, os, sys
from torch.utils.tensorboard import SummaryWriter
d = sys.argv[1]
N = 50
loss = {s: 10 * math.exp(-s / 20) + 1 + 0.01 * math.sin(s) for s in range(1, N + 1)}
gn = {s: 2 + 0.5 * math.cos(s / 3) for s in range(1, N + 1)}
mem = {s: 1.5e9 + 1e6 * s for s in range(1, N + 1)}
w = lambda name, text: open(os.path.join(d, name), "w").write(text)
# every controlled variable of the method recorded (docs/layer3.md): an arm
# that records none makes its pairs inconclusive
CTRL = {"init_weights": "sha256:0", "optimizer_state": "fresh", "data": "synthetic", "data_order": 1, "labels_mask": "all",
        "packing": False, "loss_normalization": "mean", "global_batch": 8, "grad_accumulation": 1, "lr": 1e-5,
        "lr_schedule": "constant", "clipping": 1.0, "precision": "bf16", "loss_scaling": None, "seed": 1, "recompute": "none"}
json.dump(CTRL, open(os.path.join(d, "cfg.json"), "w"))
json.dump(dict(CTRL, lr=2e-5), open(os.path.join(d, "cfg_lr.json"), "w"))
# the reference: every step
w("ref.jsonl", "".join(json.dumps({"step": s, "loss": loss[s], "grad_norm": gn[s], "mem": mem[s]}) + "\n" for s in loss))
# a real NaN at step 20, as Python's json writes it
w("nan.jsonl", "".join(json.dumps({"step": s, "loss": float("nan") if s == 20 else loss[s], "grad_norm": gn[s]}) + "\n" for s in loss))
# TensorBoard, the tensorboard package's writer through torch
tb = SummaryWriter(os.path.join(d, "tb"))
for s in loss:
    tb.add_scalar("train/loss", loss[s], s)
    tb.add_scalar("train/grad_norm", gn[s], s)
tb.close()
# Hugging Face trainer_state.json (TrainerState.save_to_json: indent 2, sorted keys)
hist = []
for s in range(5, N + 1, 5):
    hist.append({"epoch": s / N, "grad_norm": gn[s], "learning_rate": 1e-5, "loss": loss[s], "step": s})
    if s % 25 == 0:
        hist.append({"epoch": s / N, "eval_loss": loss[s] + 0.1, "eval_runtime": 1.2, "step": s})
hist.append({"epoch": 1.0, "step": N, "total_flos": 1.0e12, "train_loss": 3.2, "train_runtime": 60.5})
w("trainer_state.json", json.dumps({"best_metric": None, "best_model_checkpoint": None, "epoch": 1.0, "eval_steps": 25,
    "global_step": N, "is_hyper_param_search": False, "is_local_process_zero": True, "is_world_process_zero": True,
    "log_history": hist, "logging_steps": 5, "max_steps": N, "num_train_epochs": 1, "save_steps": 500,
    "total_flos": 1.0e12, "train_batch_size": 8, "trial_name": None, "trial_params": None}, indent=2, sort_keys=True) + "\n")
# Megatron golden values as its writer makes them: iteration 1, then every
# 5th; round(value, 5); "nan" where the run logged nothing
def golden(series, logged, iters=N, start=1, every=5):
    out = {}
    for name, vals in series.items():
        keys = [k for k in range(1, iters + 1) if k == start or (k > start and k % every == 0)]
        v = {k: (round(vals[k], 5) if k in logged[name] else "nan") for k in keys}
        out[name] = {"start_step": min(v), "end_step": max(v), "step_interval": every, "values": v}
    return out
full = set(range(1, N + 1))
series = {"lm loss": loss, "grad-norm": gn, "mem-allocated-bytes": mem}
w("golden_full.json", json.dumps(golden(series, {k: full for k in series}), indent=4))
# a resumed run: nothing logged before iteration 26, memory only from 35
resumed = {"lm loss": set(range(26, N + 1)), "grad-norm": set(range(26, N + 1)), "mem-allocated-bytes": set(range(35, N + 1))}
w("golden_resumed.json", json.dumps(golden(series, resumed), indent=4))
# the older list form: positions into the TensorBoard series (element 0 is
# iteration 1), a scalar beside the metrics
w("golden_list.json", json.dumps({"lm loss": {"start_step": 0, "end_step": N, "step_interval": 5,
    "values": [round(loss[k], 5) for k in range(1, N + 1, 5)]}, "iteration_timing_avg": 0.3}))
# LLaMA-Factory's trainer_log.jsonl: every logging_steps = 5, a last line without loss
lines = []
for s in range(5, N + 1, 5):
    lines.append({"current_steps": s, "total_steps": N, "loss": loss[s], "lr": 1e-5, "epoch": s / N,
                  "percentage": 100.0 * s / N, "elapsed_time": "0:00:%02d" % s, "remaining_time": "0:00:%02d" % (N - s)})
lines.append({"current_steps": N, "total_steps": N, "epoch": 1.0, "percentage": 100.0, "elapsed_time": "0:00:50",
              "remaining_time": "0:00:00"})
w("trainer_log.jsonl", "".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines))
# a W&B CSV export: _step counts every wandb.log call (eval rows too), Step is the trainer's
rows, k = ["_step,Step,_runtime,train/loss,train/grad_norm,eval/loss"], 0
for s in range(1, N + 1):
    rows.append("%d,%d,%.1f,%r,%r," % (k, s, s * 1.5, loss[s], gn[s])); k += 1
    if s % 25 == 0:
        rows.append("%d,%d,%.1f,,,%r" % (k, s, s * 1.5, loss[s] + 0.1)); k += 1
w("wandb.csv", "\n".join(rows) + "\n")
# a writer qatcheck does not know: its step under "it"
w("own.jsonl", "".join(json.dumps({"it": s, "loss": loss[s]}) + "\n" for s in loss))
P

# run_case NAME ARM_B_JSON CHECKS [WINDOW]: ref.jsonl (under_test) against arm b
# (gradient_reference), both with the same config, beside a native_baseline
# (the method's three arms); the report at $T/NAME.json
run_case() {
  name=$1; armb=$2; checks=$3; win=${4:-[1, 50]}
  cat >"$D/$name.case.json" <<J
{"arms": {"under_test": {"log": "ref.jsonl", "config": "cfg.json"}, "gradient_reference": $armb, $NB},
 "window": $win, "pairs": {"under_test~gradient_reference": $checks}}
J
  rm -f "$T/$name.json"
  "$QATCHECK" sft -v --case "$D/$name.case.json" --json "$T/$name.json" >"$T/$name.out" 2>"$T/$name.err"
  echo $?
}
NB='"native_baseline": {"log": "ref.jsonl", "config": "cfg.json"}'
EXACT='"pointwise_abs": 0, "reasoning": "the same numbers"'
ROUND5='"pointwise_abs": 5.1e-6, "reasoning": "Megatron rounds to 5 decimals"'
F32='"pointwise_rel": 1.2e-7, "reasoning": "TensorBoard stores float32"'
passes() { # NAME RC POINTS: exit 0, every check passes on POINTS points
  [ "$2" = 0 ] && ok "$1: pass (exit 0)" || { bad "$1: exit $2"; head -5 "$T/$1.err"; }
  json_is "$T/$1.json" "r['conclusion'] == 'pass' and all(m['verdict'] == 'pass' and m['points'] == $3 for m in r['pairs'][0]['metrics'])"
}

rc=$(run_case tb '{"log": "tb", "config": "cfg.json", "tags": {"loss": "train/loss", "grad_norm": "train/grad_norm"}}' \
  "{\"loss\": {$F32}, \"grad_norm\": {$F32}}")
passes tb "$rc" 50
rc=$(run_case hf '{"log": "trainer_state.json", "config": "cfg.json"}' "{\"loss\": {$EXACT}, \"grad_norm\": {$EXACT}}" '[5, 50]')
passes hf "$rc" 10
json_is "$T/hf.json" "r['arms'][1]['format'] == 'hf_trainer_state' and r['arms'][1]['step_key'] == 'step'"
MG_TAGS='"tags": {"loss": "lm loss", "grad_norm": "grad-norm", "mem": "mem-allocated-bytes"}'
rc=$(run_case mg_full "{\"log\": \"golden_full.json\", \"config\": \"cfg.json\", $MG_TAGS}" "{\"loss\": {$ROUND5}, \"mem\": {$ROUND5}}")
passes mg_full "$rc" 11
rc=$(run_case mg_list '{"log": "golden_list.json", "config": "cfg.json", "tags": {"loss": "lm loss"}}' "{\"loss\": {$ROUND5}}")
passes mg_list "$rc" 10
grep -q "iteration_timing_avg' skipped" "$T/mg_list.err" && ok "mg_list: the scalar iteration_timing_avg is skipped, said in verbose" || bad "mg_list: $(cat "$T/mg_list.err")"
# the resumed run: the steps it logged pass; memory from 35 on (at 30 its
# "nan" beside a logged loss is an absent value)
rc=$(run_case mg_resumed "{\"log\": \"golden_resumed.json\", \"config\": \"cfg.json\", $MG_TAGS}" \
  "[{\"metric\": \"loss\", $ROUND5}, {\"metric\": \"mem\", \"window\": [35, 50], $ROUND5}]" '[26, 50]')
[ "$rc" = 0 ] && ok "mg_resumed: pass (exit 0)" || { bad "mg_resumed: exit $rc"; head -5 "$T/mg_resumed.err"; }
json_is "$T/mg_resumed.json" "[m['points'] for m in r['pairs'][0]['metrics']] == [5, 4] and all(m['verdict'] == 'pass' for m in r['pairs'][0]['metrics'])"
json_is "$T/mg_resumed.json" "r['arms'][1]['placeholders'] == 6 + 6 + 7"
grep -q 'placeholder' "$T/mg_resumed.err" && ok "mg_resumed: the placeholders are said in verbose" || bad "mg_resumed: no placeholder note: $(cat "$T/mg_resumed.err")"
# over the whole run: the first half is a gap, not a divergence
rc=$(run_case mg_gap "{\"log\": \"golden_resumed.json\", \"config\": \"cfg.json\", $MG_TAGS}" "{\"loss\": {$ROUND5}}")
[ "$rc" = 1 ] && ok "mg_gap: the steps never logged are inconclusive (exit 1)" || bad "mg_gap: exit $rc"
json_is "$T/mg_gap.json" "r['conclusion'] == 'inconclusive' and r['pairs'][0]['metrics'][0]['verdict'] == 'inconclusive' and 'gap' in r['pairs'][0]['metrics'][0]['why'] and 'non-finite' not in json.dumps(r)"
# two resumed runs against each other: no NaN vs NaN
cat >"$D/mg_two.case.json" <<J
{"arms": {"under_test": {"log": "golden_resumed.json", "config": "cfg.json", $MG_TAGS}, "gradient_reference": {"log": "golden_resumed.json", "config": "cfg.json", $MG_TAGS}, $NB},
 "window": [26, 50], "pairs": {"under_test~gradient_reference": {"loss": {$EXACT}, "grad_norm": {$EXACT}}}}
J
expect_exit 0 "two resumed Megatron runs: the placeholders are no NaN vs NaN" "$QATCHECK" sft --case "$D/mg_two.case.json" --json "$T/mg_two.json"
rc=$(run_case lf '{"log": "trainer_log.jsonl", "config": "cfg.json"}' "{\"loss\": {$EXACT}}" '[5, 50]')
passes lf "$rc" 10
json_is "$T/lf.json" "r['arms'][1]['step_key'] == 'current_steps'"
rc=$(run_case wandb '{"log": "wandb.csv", "config": "cfg.json", "tags": {"loss": "train/loss", "grad_norm": "train/grad_norm"}}' \
  "{\"loss\": {$EXACT}, \"grad_norm\": {$EXACT}}")
passes wandb "$rc" 50
json_is "$T/wandb.json" "r['arms'][1]['step_key'] == 'Step'"
rc=$(run_case own '{"log": "own.jsonl", "config": "cfg.json", "step_key": "it"}' "{\"loss\": {$EXACT}}")
passes own "$rc" 50
rc=$(run_case own_nokey '{"log": "own.jsonl", "config": "cfg.json"}' "{\"loss\": {$EXACT}}")
[ "$rc" = 2 ] && grep -q "line 1 has no step: none of step" "$T/own_nokey.err" && grep -q 'step_key' "$T/own_nokey.err" \
  && ok "an unknown step key is refused, the hint names step_key" || bad "own_nokey: exit $rc: $(cat "$T/own_nokey.err")"
# a real NaN in a numeric log is data: it deviates
rc=$(run_case nan '{"log": "nan.jsonl", "config": "cfg.json"}' "{\"loss\": {$EXACT}}")
[ "$rc" = 1 ] && ok "a logged NaN deviates (exit 1)" || bad "nan: exit $rc"
json_is "$T/nan.json" "r['conclusion'] == 'deviates' and r['pairs'][0]['metrics'][0]['bound'] == 'nonfinite' and r['pairs'][0]['first_deviation']['step'] == 20"

# irregular logging (18, 47, 62, 63, ...): judged at the steps both logs
# hold; a gap only where the window really lacks data
$PY - "$D" <<'P' || bad "writing the irregular logs"
import json, math, os, random, sys
d = sys.argv[1]
r = random.Random(7)
steps = sorted(r.sample(range(1, 501), 90))
steps = sorted(set(steps) | {18, 47, 62, 63})
loss = lambda s: 10 * math.exp(-s / 200) + 1
open(os.path.join(d, "irr.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": loss(s)}) + "\n" for s in steps))
holed = [s for s in steps if not 200 <= s <= 350]
open(os.path.join(d, "holed.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": loss(s)}) + "\n" for s in holed))
open(os.path.join(d, "every.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": loss(s)}) + "\n" for s in range(1, 501)))
P
irr_case() { # NAME LOG_A LOG_B [EXTRA]
  cat >"$D/$1.case.json" <<J
{"arms": {"under_test": {"log": "$2", "config": "cfg.json"}, "gradient_reference": {"log": "$3", "config": "cfg.json"}, $NB},
 "window": [1, 500], $4 "pairs": {"under_test~gradient_reference": {"loss": {$EXACT}}}}
J
}
irr_case irr_self irr.jsonl irr.jsonl
expect_exit 0 "an irregular log against itself passes" "$QATCHECK" sft --case "$D/irr_self.case.json" --json "$T/irr_self.json"
irr_case irr_every irr.jsonl every.jsonl
expect_exit 0 "an irregular log against one of every step: compared at the steps both hold" "$QATCHECK" sft --case "$D/irr_every.case.json" --json "$T/irr_every.json"
json_is "$T/irr_every.json" "r['pairs'][0]['metrics'][0]['points'] == r['arms'][0]['steps']"
irr_case irr_hole holed.jsonl holed.jsonl
expect_exit 1 "an irregular log without steps 200-350 is a gap" "$QATCHECK" sft --case "$D/irr_hole.case.json" --json "$T/irr_hole.json"
json_is "$T/irr_hole.json" "r['pairs'][0]['metrics'][0]['why'].count('has a gap') == 1 and 'irregular' in r['pairs'][0]['metrics'][0]['why']"
irr_case irr_declared holed.jsonl holed.jsonl '"max_gap": 200,'
expect_exit 0 "a declared max_gap accepts the stretch" "$QATCHECK" sft --case "$D/irr_declared.case.json" --json "$T/irr_declared.json"

# gzip: logs are read through it (by the magic bytes, whatever the name);
# cases, dumps and safetensors are refused naming the file
gzip -c "$D/ref.jsonl" >"$D/ref.jsonl.gz"
head -n 20 "$D/ref.jsonl" | gzip -c >"$D/two.log"; tail -n +21 "$D/ref.jsonl" | gzip -c >>"$D/two.log"
gzip -c "$D/golden_resumed.json" >"$D/golden_resumed.json.gz"
rc=$(run_case gz '{"log": "ref.jsonl.gz", "config": "cfg.json"}' "{\"loss\": {$EXACT}, \"grad_norm\": {$EXACT}}")
passes gz "$rc" 50
rc=$(run_case gz2 '{"log": "two.log", "config": "cfg.json"}' "{\"loss\": {$EXACT}}")
passes gz2 "$rc" 50
rc=$(run_case gzmg "{\"log\": \"golden_resumed.json.gz\", \"config\": \"cfg.json\", $MG_TAGS}" "{\"loss\": {$ROUND5}}" '[26, 50]')
passes gzmg "$rc" 5
head -c 300 "$D/ref.jsonl.gz" >"$D/cut.jsonl.gz"
rc=$(run_case gzcut '{"log": "cut.jsonl.gz", "config": "cfg.json"}' "{\"loss\": {$EXACT}}")
[ "$rc" = 2 ] && [ "$(grep -c 'qatcheck: error:' "$T/gzcut.err")" = 1 ] && grep -q "cut.jsonl.gz': the gzip data ends early" "$T/gzcut.err" \
  && ok "a truncated gzip log is refused naming the file" || bad "gzcut: exit $rc: $(cat "$T/gzcut.err")"
gz_refused() { # DESC NEEDLE ARGS...
  desc=$1; needle=$2; shift 2
  expect_exit 2 "$desc" "$QATCHECK" "$@"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" = 1 ] && grep -q -- "$needle': is gzip-compressed: decompress it first" "$T/err" \
    || bad "$desc: $(cat "$T/err")"
}
gzip -c "$D/own.case.json" >"$D/own.case.json.gz"
gz_refused "a gzip-compressed sft case" "own.case.json.gz" sft --case "$D/own.case.json.gz"
gzip -c "$D/cfg.json" >"$D/cfg.json.gz"
sed 's/"config": "cfg.json"}, "gradient_reference"/"config": "cfg.json.gz"}, "gradient_reference"/' "$D/own.case.json" >"$D/gzcfg.case.json"
gz_refused "a gzip-compressed config" "cfg.json.gz" sft --case "$D/gzcfg.case.json"
$PY - "$D" <<'P' || bad "writing a dump and a safetensors file"
import h5py, json, os, struct, sys
d = sys.argv[1]
h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
open(os.path.join(d, "m.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<2f", 1, 2))
with h5py.File(os.path.join(d, "d.h5"), "w") as f:
    f.attrs["qatcheck_step"] = 1
json.dump({"dump": "d.h5.gz", "tolerances": {"update": {"rel_l2": 1e-3, "reasoning": "x"}}}, open(os.path.join(d, "step.json"), "w"))
P
gzip -kf "$D/m.safetensors" "$D/d.h5"
gz_refused "a gzip-compressed step dump" "d.h5.gz" step --case "$D/step.json"
gz_refused "a gzip-compressed safetensors checkpoint" "m.safetensors.gz" quant --checkpoint "$D/m.safetensors.gz" --master "$D/m.safetensors"

# the onset: a drift from step 330 crosses a pointwise bound much later; the
# report gives both the crossing and the onset
$PY - "$D" <<'P' || bad "writing the drift"
import json, math, os, random, sys
d = sys.argv[1]
r = random.Random(1)
base = {s: 10 * math.exp(-s / 200) + 1 for s in range(1, 601)}
open(os.path.join(d, "base.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in base.items()))
drift = {s: v * (1 + 2e-4 * (r.random() - 0.5) + (1e-4 * (s - 330) if s > 330 else 0)) for s, v in base.items()}
open(os.path.join(d, "drift.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in drift.items()))
P
cat >"$D/drift.case.json" <<J
{"arms": {"under_test": {"log": "drift.jsonl", "config": "cfg.json"}, "gradient_reference": {"log": "base.jsonl", "config": "cfg.json"}, $NB},
 "window": [1, 600], "pairs": {"under_test~gradient_reference": {"loss": {"pointwise_rel": 0.016, "reasoning": "1.6% per step"}}}}
J
expect_exit 1 "a drift deviates" "$QATCHECK" sft --case "$D/drift.case.json" --json "$T/drift.json"
json_is "$T/drift.json" "480 <= r['pairs'][0]['first_deviation']['step'] <= 495 and abs(r['pairs'][0]['first_deviation']['onset']['step'] - 330) <= 10 and r['pairs'][0]['first_deviation']['onset']['kind'] == 'drift'"
grep -q "DEVIATES at step 4[89][0-9] .*onset ~step 3[23][0-9] (loss, drift" "$T/out" && ok "the console gives the crossing and the onset" || bad "drift console: $(grep pair "$T/out")"
# an undeclared config difference is named first when the pair deviates
sed 's/"log": "drift.jsonl", "config": "cfg.json"/"log": "drift.jsonl", "config": "cfg_lr.json"/' "$D/drift.case.json" >"$D/drift_lr.case.json"
expect_exit 1 "a drift with an undeclared lr difference deviates" "$QATCHECK" sft --case "$D/drift_lr.case.json" --json "$T/drift_lr.json"
json_is "$T/drift_lr.json" "r['pairs'][0]['undeclared_differences'] == ['lr'] and r['pairs'][0]['advice'].startswith('first explain the undeclared differences (lr)')"
grep -A20 "^pair under_test~gradient_reference" "$T/out" | grep -- "->" | head -1 | grep -q "first explain the undeclared differences (lr)" \
  && ok "the console names the undeclared difference before the localization" || bad "drift_lr console: $(cat "$T/out")"
# readable numbers: on a tokens axis the step too; re-logged steps noted;
# a long config value clipped at a word, never mid-word
$PY - "$D" <<'P' || bad "writing the token logs"
import json, os, sys
d = sys.argv[1]
for name in ("base", "drift"):
    recs = [json.loads(l) for l in open(os.path.join(d, name + ".jsonl"))]
    out = []
    for r in recs:
        r["tokens"] = 2048 * r["step"]
        if name == "drift" and 470 <= r["step"] <= 510:  # a restart re-logged these steps: first a stale value, then the kept one
            out.append(json.dumps(dict(r, loss=r["loss"] * 1.5)))
        out.append(json.dumps(r))
    open(os.path.join(d, name + "_tok.jsonl"), "w").write("\n".join(out) + "\n")
long = "fp8_block128 weights with bf16 activations and a float32 reference backward"
CTRL = json.load(open(os.path.join(d, "cfg.json")))
json.dump(dict(CTRL, precision=long), open(os.path.join(d, "cfg_p1.json"), "w"))
json.dump(dict(CTRL, precision="bf16"), open(os.path.join(d, "cfg_p2.json"), "w"))
P
cat >"$D/tok.case.json" <<J
{"arms": {"under_test": {"log": "drift_tok.jsonl", "config": "cfg_p1.json"}, "gradient_reference": {"log": "base_tok.jsonl", "config": "cfg_p2.json"},
          "native_baseline": {"log": "base_tok.jsonl", "config": "cfg_p2.json"}},
 "x": "tokens", "window": [2048, 1228800], "expected_differences": {"precision": "the recipe under test"},
 "pairs": {"under_test~gradient_reference": {"loss": {"pointwise_rel": 0.016, "reasoning": "1.6% per step"}}}}
J
expect_exit 1 "the drift on a tokens axis deviates" "$QATCHECK" sft --case "$D/tok.case.json" --json "$T/tok.json"
grep -q "DEVIATES at tokens [0-9],[0-9][0-9][0-9],[0-9][0-9][0-9] (step 4[89][0-9]) .*onset ~tokens [0-9][0-9][0-9],[0-9][0-9][0-9] (step 3[23][0-9])" "$T/out" \
  && ok "on a tokens axis the step is printed too" || bad "tokens console: $(grep pair "$T/out")"
grep -q "log under_test: 41 step(s) re-logged with another value (first at step 470" "$T/out" && grep -q "was re-logged in '.*drift_tok.jsonl'" "$T/out" \
  && ok "re-logged steps noted, and on the first deviation" || bad "re-logged: $(cat "$T/out")"
json_is "$T/tok.json" "r['pairs'][0]['first_deviation']['relogged'] is True"
line=$(grep "^  precision" "$T/out")
case "$line" in
  *"fp8_block128 weights with bf16 activations and a float32 reference backward"*) bad "the long value was not clipped: $line" ;;
  *"fp8_block128 weights with bf16..."*|*"fp8_block128 weights with bf16 activations..."*) ok "a long config value is clipped at a word" ;;
  *) bad "a long config value cut mid-word: $line" ;;
esac
finish
