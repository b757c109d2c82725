#!/bin/sh
# robustness.sh: corrupt, hostile and special inputs end in exit 2 and one
# error line, within seconds, touching no file (docs/robustness.md). The
# reproducers of an adversarial review: one-byte flips of the repo's own
# dump that crashed (0x819: 0x00 -> 0x2a, SIGSEGV in libhdf5) or hung (0x960:
# 0x08 -> 0x00) every verb, truncations and other flips of it, FIFOs for the
# case, dump and plugin, seed 1e300, a norm_ratio of infinities, a 73 KB
# dump claiming a 5 x 10^9-element tensor, and a run that hangs (--timeout:
# its error report replaces an older report). The newer readers: a
# safetensors header cut short, a TensorBoard event file flipped or cut,
# FIFOs as checkpoint, log, config and step dump, flips of a step dump.
# (The report-path reproducers, /dev/full, the 1,204-character path and an
# unwritable --junit, are in reports_trust.sh.)
. "$(dirname "$0")/lib.inc"
export QATCHECK_HDF5_DEADLINE=1 # the sandbox's no-progress limit in CPU seconds, which a hung libhdf5 spins through (default 4 s and more)
SRC=cases/data/linear_small.h5
MOD=/model.layers.0.mlp.down_proj
mkdir -p "$T/w"
W="$T/w"
printf '%s\n' "keep me" >"$W/sentinel.txt"
snap() { (cd "$W" && ls -lA --time-style=+%s . | sed 1d | awk '{print $1, $5, $6, $7}'; find . -type f -exec sha256sum {} +) >"$1"; }
case_for() { # case_for NAME DUMP: a strong linear case on DUMP, in $W
  printf '{"module": "linear", "data": {"dump": "%s"}, "candidate": "dump", %s}\n' "$2" "$LIN_TOL" >"$W/$1.json"
}
# one_line DESC NEEDLE: exactly one error line, naming NEEDLE
one_line() {
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: expected one error line: $(head -3 "$T/err")"
  [ -z "$2" ] || grep '^qatcheck: error:' "$T/err" | grep -q -- "$2" || bad "$1: the message does not name '$2': $(head -2 "$T/err")"
}
# refused DESC NEEDLE CMD...: exit 2, one line naming NEEDLE, no file of $W changed or added, within 20 s
refused() {
  desc=$1; needle=$2; shift 2
  snap "$T/before"
  t0=$(date +%s)
  expect_exit 2 "$desc" timeout 60 "$@"
  t1=$(date +%s)
  one_line "$desc" "$needle"
  [ $((t1 - t0)) -le 20 ] || bad "$desc: took $((t1 - t0)) s"
  snap "$T/after"
  cmp -s "$T/before" "$T/after" || bad "$desc: files changed: $(diff "$T/before" "$T/after" | head -4)"
}
flip() { # flip OFFSET VALUE OUT: SRC with one byte replaced
  $PY -c 'import sys; b=bytearray(open(sys.argv[1],"rb").read()); b[int(sys.argv[2],0)]=int(sys.argv[3],0); open(sys.argv[4],"wb").write(b)' "$SRC" "$1" "$2" "$3"
}
# flips FILE DIR "OFFSET..." "VALUE...": DIR/OFFSET_VALUE.h5, FILE with that
# one byte replaced, for each offset and value (one python for all: its
# start costs more than a qatcheck run)
flips() {
  mkdir -p "$2"
  $PY - "$@" <<'P'
import sys
src, out, offs, vals = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
data = open(src, "rb").read()
for off in offs:
    for v in vals:
        b = bytearray(data)
        b[int(off, 0)] = int(v, 0)
        open("%s/%s_%s.h5" % (out, off, v), "wb").write(b)
P
}

# ---- the two reproducers, through every verb that reads a dump ----------------
flip 0x819 0x2a "$W/segv.h5"
flip 0x960 0x00 "$W/hang.h5"
case_for segv segv.h5
case_for hang hang.h5
refused "vjp: 0x819 -> 0x2a (a SIGSEGV inside libhdf5)" "libhdf5 crashed reading group '$MOD' attribute 'class'" \
  "$QATCHECK" vjp --case "$W/segv.json"
grep -q "corrupt or unreadable HDF5" "$T/err" && ok "names the dump as corrupt" || bad "message: $(cat "$T/err")"
refused "vjp: 0x960 -> 0x00 (libhdf5 spins forever)" "libhdf5 hung for 1 s reading group '$MOD'" \
  "$QATCHECK" vjp --case "$W/hang.json"
for f in segv hang; do
  refused "contract on the $f flip" "corrupt or unreadable HDF5" "$QATCHECK" contract --master-vs-dequant --dump "$W/$f.h5"
  refused "quant on the $f flip" "corrupt or unreadable HDF5" "$QATCHECK" quant --dump "$W/$f.h5" --module "$MOD" --format fp8_channel
done
rm -f "$W"/segv.* "$W"/hang.*

# ---- truncations and other one-byte flips: never a signal, a hang or two lines -
size=$(wc -c <"$SRC")
for n in 0 7 8 100 512 2048 2100 2400 4096 8192 $((size / 2)) $((size - 1)); do
  head -c "$n" "$SRC" >"$W/trunc.h5"
  case_for trunc trunc.h5
  refused "a dump cut to $n of $size bytes" "trunc.h5" "$QATCHECK" vjp --case "$W/trunc.json"
done
rm -f "$W"/trunc.*
# flips across the metadata (superblock, object headers, heaps, B-trees):
# a judged run (0, 1) or one refusal line (2); any other status is a crash
case_for flip flip.h5
nflip=0
offs="0 8 9 12 13 16 24 40 48 96 136 200 280 344 600 800 1000 1100 1200 1500 1700 1800 1900 2000 2050
      2073 2100 2200 2300 2350 2400 2500 2600 2700 3000 3500 4000"
flips "$SRC" "$T/flips" "$offs" "0x00 0xff 0x2a"
for off in $offs; do
  for v in 0x00 0xff 0x2a; do
    mv "$T/flips/${off}_$v.h5" "$W/flip.h5" || bad "flip $off=$v: not written"
    timeout 60 "$QATCHECK" vjp --case "$W/flip.json" >"$T/out" 2>"$T/err"; rc=$?
    nflip=$((nflip + 1))
    case $rc in
      0|1) ;;
      2) [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "flip $off=$v: exit 2 with $(grep -c '^qatcheck: error:' "$T/err") error lines" ;;
      *) bad "flip $off=$v: exit $rc: $(head -c 300 "$T/err")" ;;
    esac
  done
done
ok "$nflip one-byte flips: every run judged or refused with one line"
rm -f "$W"/flip.*

# ---- the fuzzers' regression inputs, through the tool a user runs ------------------
for f in tests/fuzz/regress/dump/*; do
  [ -f "$f" ] || continue
  cp "$f" "$W/reg.h5"
  case_for reg reg.h5
  timeout 60 "$QATCHECK" vjp --case "$W/reg.json" >"$T/out" 2>"$T/err"; rc=$?
  case $rc in
    0|1) ok "regress $(basename "$f"): judged (exit $rc)" ;;
    2) one_line "regress $(basename "$f")" ""; ok "regress $(basename "$f"): refused with one line" ;;
    *) bad "regress $(basename "$f"): exit $rc" ;;
  esac
done
rm -f "$W"/reg.*
printf '{"dump": "reg.h5", "tolerances": {"update": {"rel_l2": 1e-3, "reasoning": "r"}}}\n' >"$W/reg.json"
for f in tests/fuzz/regress/stepdump/*; do
  [ -f "$f" ] || continue
  cp "$f" "$W/reg.h5"
  timeout 60 "$QATCHECK" step --case "$W/reg.json" >"$T/out" 2>"$T/err"; rc=$?
  case $rc in
    0|1) ok "regress stepdump $(basename "$f"): judged (exit $rc)" ;;
    2) one_line "regress stepdump $(basename "$f")" ""; ok "regress stepdump $(basename "$f"): refused with one line" ;;
    *) bad "regress stepdump $(basename "$f"): exit $rc" ;;
  esac
done
rm -f "$W"/reg.*

# ---- special files: refused before they are opened ------------------------------
mkfifo "$W/fifo"
refused "a FIFO as the case" "a FIFO" "$QATCHECK" vjp --case "$W/fifo"
case_for fifo_dump fifo
refused "a FIFO as the dump" "a FIFO" "$QATCHECK" vjp --case "$W/fifo_dump.json"
refused "a FIFO as contract's dump" "a FIFO" "$QATCHECK" contract --master-vs-dequant --dump "$W/fifo"
printf '{"module": "linear", "data": {"generate": {"shapes": [[4, 8, 8]]}}, "candidate": {"plugin": "fifo", "symbol": "f"}, %s}\n' \
  "$LIN_TOL" >"$W/fifo_plugin.json"
refused "a FIFO as the plugin" "a FIFO" "$QATCHECK" vjp --case "$W/fifo_plugin.json"
refused "a directory as the dump" "a directory" "$QATCHECK" quant --dump "$W" --module "$MOD" --format fp8_channel
rm -f "$W"/fifo*

# ---- numbers out of range, bounds that are not finite ----------------------------
gen() { # gen NAME SEED NORM_RATIO
  printf '{"module": "rmsnorm", "data": {"generate": {"shapes": [[4, 8]], "seed": %s}}, "tolerances": {"d_x": {"rel_l2": 1e-5, "norm_ratio": %s, "reasoning": "r"}, "d_weight": {"rel_l2": 1e-5, "reasoning": "r"}}}\n' \
    "$2" "$3" >"$W/$1.json"
}
for s in 1e300 1e999 18446744073709551616 -1 0.5; do
  gen seed 0 "[0.9, 1.1]"
  sed "s/\"seed\": 0/\"seed\": $s/" "$W/seed.json" >"$W/seed2.json"
  refused "seed $s" "key 'seed'" "$QATCHECK" vjp --case "$W/seed2.json"
done
gen nr 0 "[-1e999, 1e999]"
refused "norm_ratio of infinities" "expected finite bounds" "$QATCHECK" vjp --case "$W/nr.json"
rm -f "$W"/seed*.json "$W"/nr.json

# ---- a dump that claims far more than it holds -------------------------------
$PY - "$SRC" "$W" <<'P'
import sys, shutil, h5py
src, w = sys.argv[1], sys.argv[2]
M = "/model.layers.0.mlp.down_proj"
for name, chunks in (("claim", None), ("claim_chunked", (1000, 1000))):
    shutil.copy(src, f"{w}/{name}.h5")
    with h5py.File(f"{w}/{name}.h5", "a") as f:
        g = f[M + "/inputs"]; del g["x"]
        d = g.create_dataset("x", shape=(100000, 50000), dtype="u2", chunks=chunks)  # 5e9 bf16 elements, none stored
        d.attrs["dtype"] = "bfloat16"
P
for name in claim claim_chunked; do
  [ "$(wc -c <"$W/$name.h5")" -lt 200000 ] || bad "$name.h5 is not small"
  case_for "$name" "$name.h5"
  s0=$(date +%s%N)
  refused "vjp: a small dump claiming 5e9 elements ($name)" "inputs/x" "$QATCHECK" vjp --case "$W/$name.json"
  ms=$((($(date +%s%N) - s0) / 1000000))
  [ "$ms" -lt 3000 ] && ok "refused in $ms ms (no 9 GiB read)" || bad "$name: took $ms ms"
done
rm -f "$W"/claim*

# ---- the readers main gained: safetensors, layer 3's logs and configs, step dumps ----
# (their fuzz seeds are what the real writers made: tests/fuzz/make_seeds.py)
S=tests/fuzz/seeds
head -c 60 "$S/safetensors/f32_f16_u8.safetensors" >"$W/cut.safetensors"
refused "a safetensors header cut short" "does not fit the file" \
  "$QATCHECK" contract --master-vs-dequant --checkpoint "$W/cut.safetensors" --weight-format fp8_block128
mkfifo "$W/fifo"
refused "a FIFO as a safetensors checkpoint" "a FIFO" \
  "$QATCHECK" contract --master-vs-dequant --checkpoint "$W/fifo" --weight-format fp8_block128
sft_case() { # sft_case LOG CONFIG: two arms on LOG, the first with CONFIG ("" none)
  cfg=""; [ -z "$2" ] || cfg=", \"config\": \"$2\""
  printf '{"arms": {"a": {"log": "%s"%s, "tags": {"loss": "train/loss"}}, "b": {"log": "%s", "tags": {"loss": "train/loss"}}}, "window": [1, 3], "pairs": {"a~b": {"loss": {"pointwise_abs": 0, "reasoning": "r"}}}}\n' \
    "$1" "$cfg" "$1" >"$W/sft.json"
}
$PY - "$S/tfevents/scalars_simple.tfevents" "$W/ev" <<'P'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[len(b) // 2] ^= 0x10; open(sys.argv[2], "wb").write(bytes(b))
P
sft_case ev ""
refused "a TensorBoard event file with a flipped byte" "corrupt event file" "$QATCHECK" sft --case "$W/sft.json"
head -c 100 "$S/tfevents/scalars_simple.tfevents" >"$W/ev"
refused "a TensorBoard event file cut short" "truncated" "$QATCHECK" sft --case "$W/sft.json"
rm -f "$W/ev"
sft_case fifo ""
refused "a FIFO as a log" "a FIFO" "$QATCHECK" sft --case "$W/sft.json"
cp "$S/tfevents/scalars_simple.tfevents" "$W/ev"
sft_case ev fifo
refused "a FIFO as a config" "a FIFO" "$QATCHECK" sft --case "$W/sft.json"
printf '{"dump": "fifo", "tolerances": {"update": {"rel_l2": 1e-3, "reasoning": "r"}}}\n' >"$W/step.json"
refused "a FIFO as a step dump" "a FIFO" "$QATCHECK" step --case "$W/step.json"
# a step dump with one byte flipped across its metadata: judged, or refused with one line
STEP="$S/stepdump/two_arms.h5"
printf '{"dump": "s.h5", "tolerances": {"update": {"rel_l2": 1e-3, "reasoning": "r"}, "update_pair": {"rel_l2": 0.02, "reasoning": "r"}, "grad_pair": {"rel_l2": 0.02, "reasoning": "r"}}}\n' >"$W/step.json"
nflip=0
offs="0 8 16 40 96 200 344 800 1000 1500 2000 2100 2400 3000 4000 6000"
flips "$STEP" "$T/sflips" "$offs" "0x00 0xff"
for off in $offs; do
  for v in 0x00 0xff; do
    mv "$T/sflips/${off}_$v.h5" "$W/s.h5" || bad "step flip $off=$v: not written"
    timeout 60 "$QATCHECK" step --case "$W/step.json" >"$T/out" 2>"$T/err"; rc=$?
    nflip=$((nflip + 1))
    case $rc in
      0|1) ;;
      2) [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "step flip $off=$v: exit 2 with $(grep -c '^qatcheck: error:' "$T/err") error lines" ;;
      *) bad "step flip $off=$v: exit $rc: $(head -c 300 "$T/err")" ;;
    esac
  done
done
ok "$nflip one-byte flips of a step dump: every run judged or refused with one line"
rm -f "$W"/fifo "$W"/ev "$W"/cut.safetensors "$W"/sft.json "$W"/step.json "$W"/s.h5

# ---- a run that hangs: --timeout ends it ---------------------------------------------
SO="$(pwd)/build/plugins/linear_plugin.so"
if [ -f "$SO" ]; then
  printf '{"module": "linear", "data": {"generate": {"shapes": [[4, 8, 8]]}}, "candidate": {"plugin": "%s", "symbol": "linear_vjp_hangs"}, %s}\n' \
    "$SO" "$LIN_TOL" >"$W/hangs.json"
  refused "a plugin that never returns, --timeout 1" "did not finish within --timeout 1 s" \
    "$QATCHECK" vjp --case "$W/hangs.json" --timeout 1
  # an older report at the requested path: replaced by the error report, as at any exit 2
  mkdir -p "$T/rep"
  expect_exit 0 "a report that passes" "$QATCHECK" vjp --case cases/linear_dump.json --json "$T/rep/r.json" --quiet
  printf 'mine\n' >"$T/rep/other.txt"
  expect_exit 2 "the hanging plugin with --json" timeout 60 "$QATCHECK" vjp --case "$W/hangs.json" --timeout 1 --json "$T/rep/r.json"
  grep -q '"verdict":[[:space:]]*"error"' "$T/rep/r.json" && grep -q 'did not finish within --timeout 1 s' "$T/rep/r.json" &&
    ok "the timed-out run replaced the older report with its error report" || bad "after the timeout: $(head -c 300 "$T/rep/r.json")"
  [ "$(cat "$T/rep/other.txt")" = mine ] && [ "$(ls -A "$T/rep" | wc -l)" -eq 2 ] && ok "no other file touched, no temporary left" ||
    bad "the report folder holds: $(ls -A "$T/rep")"
  rm -f "$W/hangs.json"
fi
expect_exit 2 "--timeout -1 is refused" "$QATCHECK" vjp --case cases/linear_dump.json --timeout -1
one_line "--timeout -1" "--timeout"

[ "$(cat "$W/sentinel.txt")" = "keep me" ] && [ "$(ls "$W")" = "sentinel.txt" ] && ok "no file left behind" || bad "files: $(ls "$W")"
finish
