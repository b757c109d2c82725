#!/bin/sh
# fd_all.sh: `qatcheck fd` agrees with the float64 reference of every class
# that has a forward (default shapes and contract variants), and refuses bad
# input with exit 2.
set -u
Q=${QATCHECK:-./qatcheck}
fail=0
expect() { # expect RC ARGS...
  want=$1; shift
  out=$("$Q" "$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then echo "FAIL: qatcheck $* -> $rc (want $want)"; printf '%s\n' "$out" | tail -5; fail=1; fi
}
classes=$("$Q" fd --help | sed -n 's/.*--module CLASS *the class; one of: *//p')
[ -n "$classes" ] || { echo "FAIL: fd --help lists no classes"; exit 1; }
# fd --help lists every class the class table says has a float64 forward
want=$("$Q" classes --json | ${PY:-/usr/bin/python3} -c 'import json,sys; print(" ".join(c["name"] for c in json.load(sys.stdin)["classes"] if c["fd"]))')
[ "$classes" = "$want" ] || { echo "FAIL: fd --help lists '$classes', the class table '$want'"; fail=1; }
for c in $classes; do expect 0 fd --module "$c" --quiet; done
expect 0 fd --module rope --shape 6,2,16 --set layout=interleaved --set inverse=yes --set rotary_dim=8 --set position_offset=100 --quiet
expect 0 fd --module swiglu --set limit=7 --set at_limit=block --seed 4 --quiet
expect 0 fd --module gelu --set approximate=tanh --quiet
expect 0 fd --module logprob --shape 4,5,24 --set normalization=mean_sequences --set vocab_shards=4 --set temperature=0.8 --quiet
expect 0 fd --module router --set score=sqrt_softplus --set normalize=yes --directions 5 --quiet
expect 0 fd --module router --values special --set score=sigmoid --set normalize=yes --quiet
expect 0 fd --module attention --shape 1,8,2,7,10 --set causal=false --set softmax_scale=0.3 --quiet
expect 0 fd --module attention --shape 2,4,4,1,5 --quiet
expect 0 fd --module attention --shape 1,4,2,7,6,5 --set softcap=3 --set window=3 --quiet  # MLA: v's head_dim 5, q and k's 6
expect 0 fd --module moe --set activation=relu2 --shape 9,8,5,5,4 --quiet
expect 0 fd --module moe --set limit=1 --set at_limit=block --shape 6,8,5,4,3 --seed 3 --quiet
expect 0 fd --module ssd --shape 2,11,3,3,4 --set initial_state=true --set chunk_size=4 --quiet
expect 0 fd --module ssd --shape 1,1,2,2,3 --quiet
expect 0 fd --module ssd --values special --shape 1,20,3,2,3 --quiet
# a disagreement exits 1: a zero RMSNorm row (special values) bends on the
# scale of sqrt(eps) = 1e-3 = h, which 4-point differences cannot follow
expect 1 fd --module rmsnorm --values special --quiet
# bad input: exit 2 with a message
expect 2 fd
expect 2 fd --module nosuch
expect 2 fd --module linear
expect 2 fd --module rmsnorm --shape 7
expect 2 fd --module rmsnorm --shape 7,x
expect 2 fd --module rmsnorm --set nokey=1
expect 2 fd --module rope --set layout=diagonal
expect 2 fd --module rope --set rotary_dim=5
expect 2 fd --module logprob --set vocab_shards=3
expect 2 fd --module router --shape 4,3,5
expect 2 fd --module moe --shape 4,8,4
expect 2 fd --module moe --set activation=gelu
expect 2 fd --module moe --set activation=relu2 --set limit=7
expect 2 fd --module gelu --bogus
expect 2 fd --module attention --shape 1,4,3,5,8
expect 2 fd --module attention --set lse_base=ten
expect 2 fd --module ssd --shape 2,9,2,3
expect 2 fd --module ssd --set chunk_size=0
expect 2 fd --module ssd --set initial_state=maybe
expect 2 fd --module ssd --set ngroups=2
out=$("$Q" fd --module rope --set rotary_dim=5 2>&1)
case "$out" in *"qatcheck: error:"*rotary_dim*) ;; *) echo "FAIL: message does not name rotary_dim: $out"; fail=1 ;; esac
exit $fail
