#!/bin/sh
# quant_cases.sh: the quantized linear cases pass with the builtin candidate.
# linear_nvfp4.json (about a minute on 2 cores) is left to `make demo`; the
# defects these cases must catch (a master weight under a dequant contract,
# wrong deployed bytes) are planted in quant_deployed.sh.
. "$(dirname "$0")/lib.inc"
for c in linear_fp8_block linear_fp8_block_ue8m0 linear_mxfp8 linear_fp8_token_act; do
  expect_exit 0 "cases/$c.json passes with the builtin candidate" "$QATCHECK" vjp --case "cases/$c.json"
done
finish
