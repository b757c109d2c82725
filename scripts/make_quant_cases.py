#!/usr/bin/python3
"""make_quant_cases.py: writes the five quantized linear cases (cases/linear_nvfp4.json, ...) with their
tolerances and reasoning. Run from the repository root."""
import json
OUTR = ("bf16 output rounding of the candidate: rms u/sqrt(3) = 2.3e-3 relative (u = 2^-8)")
def tol(dx_extra, dx_mult, dw_extra, dw_mult, dx_rel=4e-3, dw_rel=4e-3):
    return {
        "d_x": {"rel_l2": dx_rel, "cosine_min": 0.99999, "norm_ratio": [0.998, 1.002], "noise_multiple": dx_mult,
                "reasoning": OUTR + "; " + dx_extra + "; " + NR},
        "d_weight": {"rel_l2": dw_rel, "cosine_min": 0.99999, "norm_ratio": [0.998, 1.002], "noise_multiple": dw_mult,
                     "reasoning": OUTR + "; " + dw_extra + "; " + NR},
        "d_bias": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.995, 1.005], "noise_multiple": 1.25,
                   "reasoning": OUTR + "; fp32 sum of bf16 dY over M tokens; dY is bf16 on both sides, so the only error is the output rounding (multiple 1.0) and fp32 summation order (1.25); norm ratio wider: under sparse dY few entries are non-zero and rounding does not average out"}}
NR = ("norm ratio: a bf16 rounding changes each element by at most 2^-9 relative, so ||g||/||r|| lies within 1 +- 2^-9 = [0.99805, 1.00195] however the errors correlate (dY = ones makes every row the same column sums, so they need not average out)")
DW_PLAIN = "d_weight = dY^T X on bf16 operands both sides (dw_input original): error is the output rounding (noise multiple 1.0) plus fp32 accumulation over M <= 2048 (~sqrt(M) 2^-24, negligible); 1.25 allows summation-order boundary crossings"
OPR = ("the decoded weight q*s is rounded to bf16 as the trainer holds it (the reference keeps it exact in float64): an operand error of the same size as the output rounding and independent of it, so the error is ~sqrt(2) times the noise floor (multiple 1.6 with margin) and rel_l2 ~3.3e-3 (bound 5e-3)")
EXACT = ("the decoded weight q * 2^k (e4m3 payload, power-of-two scale) has at most 4 significant bits and is exact in bf16, so there is no operand rounding: the error is the output rounding alone (noise multiple 1.0; 1.25 for fp32 summation order)")
DY = ["random", "zero", "sparse", "ones"]
cases = {
 "linear_nvfp4": dict(description="The design card's example: an NVFP4 weight (e2m1 payload, e4m3 16-block scales, float32 global scale, profile vllm), dX from the dequantized weight, identity STE; decode (M=1), an unaligned tail (M=127) and prefill M=1024 (the design card's M=4096 passes too but takes ~3 minutes on 2 CPU cores), K=7168, N=2048; plus an unaligned K (1000: the last 16-block zero padded).",
   contract={"weight_format": "nvfp4", "activation_format": "none", "dx_weight": "dequant", "dw_input": "original", "ste": "identity", "rounding": "rn"},
   shapes=[[1, 7168, 2048], [127, 7168, 2048], [1024, 7168, 2048], [33, 1000, 96]], values=None,
   tol=tol("nvfp4 dequant e2m1 * (sf/g) is a 2-bit value times a float32 scale; " + OPR, 1.6, DW_PLAIN, 1.25, dx_rel=5e-3)),
 "linear_fp8_block": dict(description="DeepSeek-style FP8 weight: 128x128 blocks with float32 scales max(amax, 1e-4)/448 (zero padded at unaligned edges: N=200, K=2000 are not multiples of 128); normal values, so that every weight's rounding weighs in dX (linear_fp8_block_ue8m0 covers the special values); dX from the dequantized weight.",
   contract={"weight_format": "fp8_block128", "activation_format": "none", "dx_weight": "dequant", "dw_input": "original", "ste": "identity", "rounding": "rn"},
   shapes=[[1, 2000, 200], [127, 2048, 512], [2048, 2000, 200]], values=None,
   tol=tol("fp8 block dequant q * s with a non-power-of-two float32 s; " + OPR, 1.6, DW_PLAIN, 1.25, dx_rel=5e-3)),
 "linear_fp8_block_ue8m0": dict(description="FP8 128x128 blocks with power-of-two scales in vLLM's two stages (block128, dequantize, requantize with ceil2 scales), as on Hopper and Blackwell; unaligned N and K; special values (zero rows, saturation, tiny weights).",
   contract={"weight_format": "fp8_block128_ue8m0", "activation_format": "none", "dx_weight": "dequant", "dw_input": "original", "ste": "identity", "rounding": "rn"},
   shapes=[[1, 2000, 200], [127, 2048, 512], [2048, 2000, 200]], values="special",
   tol=tol(EXACT, 1.25, DW_PLAIN, 1.25)),
 "linear_mxfp8": dict(description="MXFP8 weight: e4m3 payload, one e8m0 scale ceil2(amax/448) per 32 elements along K; K = 1000 is not a multiple of 32 (the last block zero padded); M = 1, 127, 2048.",
   contract={"weight_format": "mxfp8", "activation_format": "none", "dx_weight": "dequant", "dw_input": "original", "ste": "identity", "rounding": "rn"},
   shapes=[[1, 1000, 512], [127, 1024, 768], [2048, 1000, 256]], values=None,
   tol=tol(EXACT, 1.25, DW_PLAIN, 1.25)),
 "linear_fp8_token_act": dict(description="FP8 per-token activations (s = max(amax/448, 1/229376) per row, true division) with an FP8 per-channel weight; dW from the quantized activation (dw_input quantized), dX from the dequantized weight; special values plant zero tokens (the 1/229376 floor) and activations at +448 and -1e4 (saturation).",
   contract={"weight_format": "fp8_channel", "activation_format": "fp8_token", "dx_weight": "dequant", "dw_input": "quantized", "ste": "identity", "rounding": "rn"},
   shapes=[[1, 2048, 512], [127, 1000, 768], [2048, 2048, 256]], values="special",
   tol=tol("fp8 per-channel dequant q * s with a non-power-of-two s; " + OPR, 1.6,
           "X_ref = dequant(quant(X)) per token, q * s with a non-power-of-two s, rounded to bf16 by the candidate and exact in the reference: the same operand-rounding argument as for d_x (multiple 1.6, rel_l2 bound 5e-3)", 1.6, dx_rel=5e-3, dw_rel=5e-3)),
}
for name, c in cases.items():
    gen = {"shapes": c["shapes"], "seed": 0}
    if c["values"]: gen["values"] = c["values"]
    d = {"name": name, "description": c["description"], "module": "linear", "contract": c["contract"],
         "data": {"generate": gen}, "candidate": "builtin", "dy": DY, "tolerances": c["tol"]}
    with open(f"cases/{name}.json", "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")
