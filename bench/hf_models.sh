#!/bin/sh
# hf_models.sh: the whole-model audit of tests/e2e/hf_models.sh at realistic
# sizes: per architecture (Llama, Gemma 2, Qwen2-MoE, Mamba2; hidden 2048,
# 4 layers, 2 x 1024 tokens (Qwen2-MoE 2 x 128: the moe reference runs token
# by token on the host), fp8_block128 linears), scripts/qatdump_hf.py
# runs two undumped training steps on the device (the second timed) and one
# dumped step; `qatcheck vjp` audits every dumped module on the same device.
# Prints "key value" lines per architecture: step_s (one training step:
# forward, backward, optimizer), quant_s (of it, the host-side fake
# quantization by the conformance oracle: the serving engine's arithmetic,
# not its speed), dumped_step_s, dump_write_s, dump_bytes, modules,
# audit_s, audit_exit, and audit_per_step (audit_s / step_s).
#
# usage: sh bench/hf_models.sh [--device cuda|cpu] [--size gpu|tiny]
#          [--seq N] [--format F] [--dtype float32|bfloat16] [ARCH...]
#          (default: cuda, gpu, float32, all four; bfloat16: a pure-bf16 model,
#          every parameter bf16 as from_pretrained(torch_dtype=bf16) builds it)
# QATCHECK (./qatcheck), PY (/usr/bin/python3), BENCH_TMP (a mktemp -d),
# KEEP=1 keeps each dump (removed after its audit by default). AUDIT_ARGS:
# more `qatcheck vjp` options for the timed audit (e.g. --verbose), to see
# where the first audit after a dump spends its time.
# Exit 77 with one "skip:" line without transformers 4.49, or with --device cuda
# and no CUDA device for torch; 1 when an audit does not pass; 0 otherwise.
set -u
here=$(cd "$(dirname "$0")" && pwd)
Q=${QATCHECK:-./qatcheck}
case "$Q" in /*) ;; */*) Q="$(pwd)/$Q" ;; esac
PY=${PY:-/usr/bin/python3}
dev=cuda; size=gpu; seq=""; fmt=fp8_block128; dtype=float32; archs=""
while [ $# -gt 0 ]; do
  case $1 in
    --device) dev=$2; shift ;;
    --size) size=$2; shift ;;
    --seq) seq="--seq $2"; shift ;;
    --format) fmt=$2; shift ;;
    --dtype) dtype=$2; shift ;;
    -*) echo "bench/hf_models.sh: unknown option '$1'" >&2; exit 2 ;;
    *) archs="$archs $1" ;;
  esac
  shift
done
archs=${archs:-llama gemma2 qwen2_moe mamba2}
"$PY" -c "import transformers, sys; sys.exit(not transformers.__version__.startswith('4.49.'))" 2>/dev/null ||
  { echo "skip: transformers 4.49 missing for $PY (scripts/install-deps.sh installs 4.49.0)"; exit 77; }
case $dev in cuda*)
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
    { echo "skip: --device $dev: torch sees no CUDA device"; exit 77; } ;;
esac
W=${BENCH_TMP:-$(mktemp -d)}
mkdir -p "$W"
[ -n "${BENCH_TMP:-}" ] || trap 'rm -rf "$W"' EXIT
echo "device $dev"
echo "size $size"
echo "dtype $dtype"
"$PY" -c "import torch, transformers; print('torch', torch.__version__); print('transformers', transformers.__version__)"
worst=0
for a in $archs; do
  rm -rf "${W:?}/$a"
  aseq=$seq
  # Qwen2-MoE at 2 x 128 tokens unless --seq says otherwise: the size chosen when the moe class's
  # float64 reference ran token by token on the host (about 0.4 s a token a layer at this size;
  # it now groups its products by expert through the float64 GEMM), kept so runs stay comparable
  [ -z "$seq" ] && [ "$a" = qwen2_moe ] && [ "$size" = gpu ] && aseq="--seq 128"
  # shellcheck disable=SC2086
  "$PY" "$here/../scripts/qatdump_hf.py" --arch "$a" --size "$size" --device "$dev" --format "$fmt" --dtype "$dtype" --warm 2 $aseq \
    --out "$W/$a" >"$W/$a.log" 2>&1 || { echo "hf_${a}_dump_exit $?"; tail -5 "$W/$a.log"; worst=1; continue; }
  grep '^qatdump_hf' "$W/$a.log"
  "$PY" - "$W/$a" "$a" <<'PYEOF'
import json, os, sys
p = json.load(open(sys.argv[1] + "/plan.json"))
a = sys.argv[2]
for k in ("step_s", "quant_s", "dumped_step_s"):
    if k in p:
        print("hf_%s_%s %.3f" % (a, k, p[k]))
print("hf_%s_dump_write_s %.3f" % (a, p["write_s"]))
print("hf_%s_dump_bytes %d" % (a, os.path.getsize(sys.argv[1] + "/step.h5")))
print("hf_%s_modules %d" % (a, len(p["modules"])))
print("hf_%s_tokens %d" % (a, p["tokens"]))
PYEOF
  qdev=$dev
  case $dev in cuda*) ;; *) qdev=cpu ;; esac
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  (cd "$W/$a" && "$Q" vjp --case case.json --device "$qdev" --json r.json ${AUDIT_ARGS:-} >out.txt 2>&1)
  rc=$?
  t1=$(date +%s.%N)
  tail -1 "$W/$a/out.txt"
  [ $rc -eq 0 ] || { grep FAIL "$W/$a/out.txt" | head -5; worst=1; }
  echo "hf_${a}_audit_exit $rc"
  [ "${KEEP:-0}" = 1 ] || rm -f "$W/$a/step.h5"  # about 2 GB a model at --size gpu
  "$PY" - "$W/$a/plan.json" "$a" "$t0" "$t1" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
a, t = sys.argv[2], float(sys.argv[4]) - float(sys.argv[3])
print("hf_%s_audit_s %.3f" % (a, t))
step = p.get("step_s", p["dumped_step_s"])
print("hf_%s_audit_per_step %.1f" % (a, t / step if step > 0 else float("nan")))
PYEOF
done
exit $worst
