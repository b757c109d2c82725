#!/bin/sh
# dsv3_layer.sh: a DeepSeek-V3 layer at a chosen size (issues 38 and 41):
# bench/dsv3_layer.py builds transformers 5's DeepseekV3ForCausalLM with one
# MoE layer and random weights (MLA attention, interleaved YaRN rope,
# noaux_tc router with e_score_correction_bias, routed experts under fp8
# block-128 expert QAT with their deployed bytes, one shared expert;
# fp8_block128 MLA linears), runs one forward and backward on the device,
# dumps it with scripts/qatdump.py, and `qatcheck vjp` audits the dump on
# the same device. --expert-dtype float32|bf16: the routed experts' master
# weights w1, w2 and so their gradients (the rest of the model float32; the
# experts' arithmetic float32 either way, each gradient rounded once into
# the master's dtype); default float32 for tiny and issue38, bf16 for real
# (its float32 experts alone are 84 GiB of masters and gradients, a 105 GiB
# dump). The dumper keeps its records on the host (the device holds the
# model, its gradients and the fp8 bytes, no second copy). Prints "key
# value" lines: the estimate (est_device, est_dump_gib, est_dumper_gpu_gib,
# est_host_gib), dump_s (forward, backward and the write), dump_bytes,
# dumper_rss_gib, dumper_gpu_gib (torch's peak, after the build),
# dumper_gpu_reserved_gib (its allocator's), then
# audit_s (qatcheck's wall time, reading the dump included), audit_rss_gib
# (its peak resident set), audit_gpu_gib (the device's peak memory in use
# during the audit, above what it was before; nvidia-smi), audit_exit and
# qatcheck's verdict line. With --plant, three planted bugs follow, each
# dumped and audited alike, and each must fail on its module and tensors
# alone: expert_grad (expert 2's d_w1, or the lowest busy expert's where 2 gets no
# token, one percent high: experts d_w1),
# router_bias (the router's weights from score + bias: router y, d_logits),
# o_proj_dx (o_proj's d_x times 1.001: o_proj d_x).
#
# usage: sh bench/dsv3_layer.sh [--size tiny|issue38|real] [--device cuda|cpu]
#          [--plant] [--estimate] [--expert-dtype float32|bf16] [--no-expert-bytes] [dsv3_layer.py's dims:
#          --hidden N --experts N --topk N --n-group N --topk-group N --expert-width N
#          --tokens N --heads N --attention eager|chunked]
#          (default: tiny, cuda when torch sees a device, else cpu)
# QATCHECK (./qatcheck), PY (python3; /opt/qatcheck/torch2 put first on its
# path when present, as tests/e2e/lib.inc's PY2), BENCH_TMP (a mktemp -d),
# KEEP=1 keeps each dump (removed after its audit by default). AUDIT_ARGS:
# more `qatcheck vjp` options for each audit (e.g. --verbose).
# Exit 77 with one "skip:" line without torch 2 and transformers 5, with
# --device cuda and no CUDA device, or when the estimate exceeds the disk or
# the device's memory; 2 (its one error line) when dsv3_layer.py refuses an
# argument; 1 when the clean audit does not pass or a planted bug
# does not fail as it should; 0 otherwise.
set -u
here=$(cd "$(dirname "$0")" && pwd)
Q=${QATCHECK:-./qatcheck}
case "$Q" in /*) ;; */*) Q="$(pwd)/$Q" ;; esac
PY=${PY:-python3}
T2=${QC_TORCH2:-/opt/qatcheck/torch2}
[ -d "$T2" ] && export PYTHONPATH="$T2${PYTHONPATH:+:$PYTHONPATH}"
size=tiny; dev=""; plant=0; est=""; extra=""
while [ $# -gt 0 ]; do
  case $1 in
    --size) size=$2; shift ;;
    --device) dev=$2; shift ;;
    --plant) plant=1 ;;
    --estimate) est=--estimate ;;
    --hidden|--experts|--topk|--n-group|--topk-group|--expert-width|--tokens|--heads|--expert-dtype|--attention) extra="$extra $1 $2"; shift ;;
    --no-expert-bytes) extra="$extra $1" ;;
    *) echo "bench/dsv3_layer.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
# one import of torch and transformers (seconds of CPU): the check, and the versions printed below
vers=$("$PY" -c "import torch, transformers, h5py, sys; print('torch', torch.__version__); print('transformers', transformers.__version__); sys.exit(not (int(torch.__version__.split('.')[0]) >= 2 and int(transformers.__version__.split('.')[0]) >= 5))" 2>/dev/null) ||
  { echo "skip: torch 2 and transformers 5 missing for $PY (scripts/install-deps.sh)"; exit 77; }
[ -n "$dev" ] || dev=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
case $dev in cuda*)
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
    { echo "skip: --device $dev: torch sees no CUDA device"; exit 77; } ;;
esac
qdev=cpu; case $dev in cuda*) qdev=cuda ;; esac
W=${BENCH_TMP:-$(mktemp -d)}
mkdir -p "$W"
[ -n "${BENCH_TMP:-}" ] || trap 'rm -rf "$W"' EXIT
echo "device $dev"
echo "size $size"
echo "$vers"
variants=none
[ $plant = 1 ] && variants=none,expert_grad,router_bias,o_proj_dx
# shellcheck disable=SC2086
"$PY" -W ignore "$here/dsv3_layer.py" --out "$W" --size "$size" --device "$dev" --plant $variants --qatcheck "$Q" $est $extra \
  >"$W/dump.log" 2>&1
rc=$?
grep -v '^modules ' "$W/dump.log" | grep -v '^ *not mapped' | grep -E '^[a-z_]+ |^skip:'
[ $rc = 77 ] && exit 77
[ $rc = 2 ] && { grep -m1 "error:" "$W/dump.log" >&2; exit 2; } # the dumper refused its arguments: its one line
[ $rc = 0 ] || { echo "dump_exit $rc"; tail -5 "$W/dump.log"; exit 1; }
[ -n "$est" ] && exit 0

# gpu_watch FILE: write the device's peak memory in use (MiB) into FILE,
# every 0.2 s, until killed. (A loop on `kill -0 PID` inside $(...) never
# ends: the audit, the parent shell's child, stays a zombie until that shell
# waits for it, and kill -0 succeeds on a zombie; the watcher is stopped
# after the wait instead.)
gpu_watch() {
  mx=0
  while :; do
    u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" 2>/dev/null | head -1)
    [ -n "$u" ] && [ "$u" -gt "$mx" ] 2>/dev/null && { mx=$u; echo "$mx" >"$1"; }
    sleep 0.2
  done
}
worst=0
for v in $(echo $variants | tr , ' '); do
  D=$W; [ $plant = 1 ] && D=$W/$v
  [ $plant = 1 ] && echo "variant $v"
  base=n/a
  [ $qdev = cuda ] && command -v nvidia-smi >/dev/null &&
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" | head -1)
  t0=$(date +%s.%N)
  (cd "$D" && if [ -x /usr/bin/time ]; then exec /usr/bin/time -f "rss_kib %M" -o time.txt "$Q" vjp --case case.json --device $qdev --json r.json ${AUDIT_ARGS:-}
               else exec "$Q" vjp --case case.json --device $qdev --json r.json ${AUDIT_ARGS:-}; fi) >"$D/out.txt" 2>&1 &
  pid=$!
  peak=n/a; mon=""
  if [ $qdev = cuda ] && command -v nvidia-smi >/dev/null; then rm -f "$D/peak"; gpu_watch "$D/peak" & mon=$!; fi
  wait $pid
  rc=$?
  [ -n "$mon" ] && { kill $mon 2>/dev/null; wait $mon 2>/dev/null; peak=$(cat "$D/peak" 2>/dev/null || echo n/a); }
  t1=$(date +%s.%N)
  echo "audit_s $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')"
  awk '$1 == "rss_kib" {printf "audit_rss_gib %.2f\n", $2 / 1048576}' "$D/time.txt" 2>/dev/null
  case $peak$base in *n/a*) echo "audit_gpu_gib n/a" ;;
    *) awk -v p="$peak" -v b="$base" 'BEGIN {printf "audit_gpu_gib %.2f\n", (p - b) / 1024}' ;; esac
  echo "audit_exit $rc"
  grep '^vjp:' "$D/out.txt" | tail -1
  [ "${KEEP:-0}" = 1 ] || rm -f "$D/step.h5"
  if [ "$v" = none ]; then
    [ $rc = 0 ] || { grep -E 'FAIL|error' "$D/out.txt" | head -5; worst=1; }
    continue
  fi
  # a planted bug fails its module's tensors, and nothing else
  want=$(case $v in expert_grad) echo "mlp.experts|d_w1" ;; router_bias) echo "mlp.router|d_logits mlp.router|y" ;;
         o_proj_dx) echo "self_attn.o_proj|d_x" ;; esac)
  got=$("$PY" -c 'import json, re, sys
r = json.load(open(sys.argv[1]))
print(" ".join(sorted({"%s|%s" % (re.sub(r"^/model\.layers\.\d+\.", "", c["module"]), c["tensor"])
                       for c in r["checks"] if c["verdict"] != "pass"})) or "-")' "$D/r.json" 2>/dev/null)
  if [ $rc = 1 ] && [ "$got" = "$want" ]; then echo "plant_$v ok: exit 1, failed $got"
  else echo "plant_$v FAIL: exit $rc, failed $got (expected exit 1, failed $want)"; worst=1; fi
done
exit $worst
