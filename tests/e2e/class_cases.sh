#!/bin/sh
# class_cases.sh: every shipped case of the classes beyond linear passes with
# the builtin candidate (exit 0), and its report says pass.
. "$(dirname "$0")/lib.inc"
n=0
for f in cases/rmsnorm.json cases/layernorm.json cases/rope*.json cases/swiglu*.json cases/relu2.json \
         cases/gelu.json cases/logprob*.json cases/router*.json; do
  n=$((n+1))
  expect_exit 0 "$f passes" "$QATCHECK" vjp --case "$f" --quiet --json "$T/r.json"
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["verdict"] == "pass" and r["checks"] else 1)' "$T/r.json" \
    || bad "$f: report verdict is not pass"
done
[ "$n" -ge 13 ] || bad "expected at least 13 class cases, found $n"
finish
