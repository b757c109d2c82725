#!/bin/sh
# sft_resolution.sh: `qatcheck sft` knows that TensorBoard stores a scalar
# as float32 (docs/layer3.md, "Bounds"): a relative bound below what the
# logs can resolve (1e-9 on a float32 loss) is refused before any check is
# judged, exit 2 with one line naming the pair, the metric, the arm and
# float32, and a hint with the smallest sensible bound; the same bound
# between two JSONL logs (float64 text) runs, and a bound above the
# resolution runs against the TensorBoard log and passes.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch tensorboard || { echo "skip: python3 lacks torch or tensorboard"; exit 77; }
mkdir -p "$T/tb" "$T/a" "$T/b"
$PY - "$T" <<'P' || { bad "writing the logs"; finish; }
import json, math, sys
from torch.utils.tensorboard import SummaryWriter
out = sys.argv[1]
w = SummaryWriter(f"{out}/tb")
with open(f"{out}/a/m.jsonl", "w") as fa, open(f"{out}/b/m.jsonl", "w") as fb:
    for s in range(1, 31):
        loss = 2.0 * math.exp(-s / 17) + 0.1 / 3  # not representable in float32
        w.add_scalar("loss", loss, s)
        fa.write(json.dumps({"step": s, "loss": loss}) + "\n")
        fb.write(json.dumps({"step": s, "loss": loss}) + "\n")
w.close()
for d in ("tb", "a", "b"):
    json.dump({"init_weights": "sha256:0", "optimizer_state": "fresh", "data": "synthetic", "data_order": 1, "labels_mask": "all",
               "packing": False, "loss_normalization": "mean", "global_batch": 8, "grad_accumulation": 1, "lr": 1e-4,
               "lr_schedule": "constant", "clipping": None, "precision": "bf16", "loss_scaling": None, "seed": 1,
               "recompute": "none"}, open(f"{out}/{d}/config.json", "w"))  # every controlled variable recorded
P
mkcase() { # mkcase FILE A_LOG BOUND
  cat >"$1" <<J
{"arms": {"under_test": {"log": "$2", "config": "${2%%/*}/config.json"}, "gradient_reference": {"log": "b/m.jsonl", "config": "b/config.json"},
          "native_baseline": {"log": "b/m.jsonl", "config": "b/config.json"}},
 "window": [1, 30],
 "pairs": {"under_test~gradient_reference": {"loss": {"pointwise_rel": $3, "reasoning": "the same loss logged twice"}}}}
J
}
mkcase "$T/tb_tight.json" tb "1e-9"
expect_exit 2 "a 1e-9 relative bound on a TensorBoard (float32) loss is refused" "$QATCHECK" sft --case "$T/tb_tight.json" --json "$T/r.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && ok "one error line" || bad "$(cat "$T/err")"
grep 'qatcheck: error:' "$T/err" | grep -q "metric 'loss': pointwise_rel 1e-09 is below the logs' resolution .*arm 'under_test' stores 'loss' as float32 (tfevents" \
  && ok "the line names the pair's metric, the bound, the arm and float32" || bad "$(cat "$T/err")"
grep -q "^hint: .*at least 1.19e-07" "$T/err" && ok "the hint gives the smallest sensible bound" || bad "hint: $(cat "$T/err")"
error_or_none "$T/r.json" && ok "only the error report" || bad "a report other than the error report"
mkcase "$T/json_tight.json" a/m.jsonl "1e-9"
expect_exit 0 "the same bound between two JSONL logs (float64 text) runs and passes" "$QATCHECK" sft --case "$T/json_tight.json"
mkcase "$T/tb_ok.json" tb "2e-7"
expect_exit 0 "a bound above float32's resolution runs against the TensorBoard log and passes" "$QATCHECK" sft --case "$T/tb_ok.json"
finish
