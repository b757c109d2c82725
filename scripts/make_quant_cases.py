#!/usr/bin/python3
"""make_quant_cases.py: write the five quantized linear cases
(cases/linear_nvfp4.json, linear_fp8_block.json, linear_fp8_block_ue8m0.json,
linear_mxfp8.json, linear_fp8_token_act.json). Tolerances come from
`qatcheck tol` (docs/tolerances.md), with K the largest reduction length of
the case's shapes (N for d_x, M for d_weight and d_bias) and one rounded
operand where the candidate rounds a dequantized operand to bf16 that the
float64 reference keeps exact; a sentence in front of each reasoning says
which. Run from the repository root after `make`."""
import json
import os
import subprocess

QC = os.environ.get("QATCHECK", "./qatcheck")
DY = ["random", "zero", "sparse", "ones"]

INEXACT = ("the decoded {what} q * s ({why}) is not representable in bf16: the candidate rounds it to bf16 for the "
           "GEMM, the reference keeps it exact, so one operand is rounded (--rounded-operands 1); the contract's "
           "quantizer itself runs on both sides and adds nothing")
EXACT = ("the decoded weight q * 2^k (e4m3 payload, 4 significant bits, power-of-two scale) is exact in bf16: no "
         "operand is rounded; the contract's quantizer runs on both sides and adds nothing")
PLAIN = "d_weight = dY^T X on the bf16 operands both sides hold (dw_input original): no operand is rounded"
BIAS = "d_bias = sum of the bf16 dY over the tokens: no operand is rounded"


def tol(tensor, k, rounded, why):
    args = ["tol", "--out-dtype", "bfloat16", "--operand-dtype", "bfloat16", "--acc-dtype", "float32", "--k", str(k),
            "--rounded-operands", str(rounded), "--tensor", tensor]
    out = subprocess.run([QC] + args, check=True, capture_output=True, text=True).stdout
    t = json.loads(out)[tensor]
    t["reasoning"] = why + "; " + t["reasoning"]
    return t


def case(name, description, contract, shapes, values, dx, dw):
    """dx, dw: (rounded operands, why) for d_x and d_weight."""
    M = max(s[0] for s in shapes)
    N = max(s[2] for s in shapes)
    gen = {"shapes": shapes, "seed": 0}
    if values:
        gen["values"] = values
    c = {"name": name, "description": description, "module": "linear",
         "contract": dict({"activation_format": "none", "dx_weight": "dequant", "dw_input": "original",
                           "ste": "identity", "rounding": "rn"}, **contract),
         "data": {"generate": gen}, "candidate": "builtin", "dy": DY,
         "tolerances": {"d_x": tol("d_x", N, *dx), "d_weight": tol("d_weight", M, *dw),
                        "d_bias": tol("d_bias", M, 0, BIAS)}}
    with open(f"cases/{name}.json", "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")


def main():
    case("linear_nvfp4",
         "The design card's example: an NVFP4 weight (e2m1 payload, e4m3 16-block scales, float32 global scale, "
         "profile vllm), dX from the dequantized weight, identity STE. The design card's shapes: decode (M=1), an "
         "unaligned tail (M=127) and prefill (M=4096), K=7168, N=2048 (about a minute on 2 CPU cores); and K=1000, "
         "not a multiple of 16 (the last 16-block of each row zero padded).",
         {"weight_format": "nvfp4"}, [[1, 7168, 2048], [127, 7168, 2048], [4096, 7168, 2048], [33, 1000, 96]], None,
         (1, INEXACT.format(what="weight", why="e2m1 times float(sf)/g, a float32 value")), (0, PLAIN))
    case("linear_fp8_block",
         "DeepSeek-style FP8 weight: 128x128 blocks, float32 scales max(amax, 1e-4)/448, zero padded at unaligned "
         "edges (N=200 and K=2000 are not multiples of 128); normal values, so that every weight's rounding weighs "
         "in dX (linear_fp8_block_ue8m0 covers the special values); dX from the dequantized weight.",
         {"weight_format": "fp8_block128"}, [[1, 2000, 200], [127, 2048, 512], [2048, 2000, 200]], None,
         (1, INEXACT.format(what="weight", why="a non-power-of-two float32 block scale")), (0, PLAIN))
    case("linear_fp8_block_ue8m0",
         "FP8 128x128 blocks with power-of-two scales in vLLM's two stages (block128, dequantize, requantize with "
         "ceil2 scales), as on Hopper and Blackwell; unaligned N and K; special values: zero tokens, a zero weight "
         "row, activations at +448 and -1e4, weights of 1e-8 (under the 1e-4 floor) and -3.",
         {"weight_format": "fp8_block128_ue8m0"}, [[1, 2000, 200], [127, 2048, 512], [2048, 2000, 200]], "special",
         (0, EXACT), (0, PLAIN))
    case("linear_mxfp8",
         "MXFP8 weight: e4m3 payload, one e8m0 scale ceil2(amax/448) per 32 elements along K; K=1000 is not a "
         "multiple of 32 (the last block zero padded); M = 1, 127, 2048.",
         {"weight_format": "mxfp8"}, [[1, 1000, 512], [127, 1024, 768], [2048, 1000, 256]], None,
         (0, EXACT), (0, PLAIN))
    case("linear_fp8_token_act",
         "FP8 per-token activations (s = max(amax/448, 1/229376) per row, true division) with an FP8 per-channel "
         "weight; dW from the quantized activation (dw_input quantized), dX from the dequantized weight; special "
         "values plant zero tokens (the 1/229376 floor) and activations at +448 and -1e4 (saturation).",
         {"weight_format": "fp8_channel", "activation_format": "fp8_token", "dw_input": "quantized"},
         [[1, 2048, 512], [127, 1000, 768], [2048, 2048, 256]], "special",
         (1, INEXACT.format(what="weight", why="a non-power-of-two per-channel scale")),
         (1, INEXACT.format(what="activation", why="a non-power-of-two per-token scale")))


if __name__ == "__main__":
    main()
