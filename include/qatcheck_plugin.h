/* qatcheck_plugin.h: the C ABI for a candidate VJP loaded from a shared
 * library (case file: "candidate": {"plugin": "LIB.so", "symbol": "NAME"}).
 *
 * qatcheck calls NAME once per (module, dY) with a qcp_call. The plugin
 * computes the gradients its production backward would produce and hands
 * each one back through call->emit (qatcheck copies the data, so the
 * plugin may free its buffers after emit returns). A gradient the plugin
 * does not emit is reported as missing (a failed check). Return 0 on
 * success; non-zero with a message in call->err means "could not run" and
 * makes the whole audit exit 2 (it is not a verdict).
 *
 * This header is self-contained (no qatcheck internals) and versioned by
 * QATCHECK_PLUGIN_ABI. Tensors are row-major; element types are the dump's:
 * bfloat16 is raw uint16 bits, float8/float4/e8m0 raw bytes. */
#ifndef QATCHECK_PLUGIN_H
#define QATCHECK_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define QATCHECK_PLUGIN_ABI 1

/* Element types (same numbering as the dump's dtypes). */
enum qcp_dtype {
  QCP_F64 = 0,
  QCP_F32 = 1,
  QCP_F16 = 2,
  QCP_BF16 = 3,
  QCP_I32 = 4,
  QCP_I64 = 5,
  QCP_U8 = 6,
  QCP_E4M3 = 7,
  QCP_E5M2 = 8,
  QCP_E8M0 = 9,
  QCP_E2M1X2 = 10,
  QCP_I8 = 11
};

typedef struct qcp_tensor {
  const char *name;        /* "x", "weight", "bias", "weight_q", ... */
  int dtype;               /* enum qcp_dtype */
  int ndim;
  const int64_t *shape;    /* ndim entries */
  const void *data;
} qcp_tensor;

typedef struct qcp_call {
  int abi;                 /* QATCHECK_PLUGIN_ABI */
  const char *module_class;/* "linear" */
  const char *module_path; /* "/model.layers.3.mlp.down_proj" */
  const char *contract_json; /* the validated contract, defaults filled: {"weight_format": "none", ...} */
  const qcp_tensor *inputs; int n_inputs;   /* inputs/  */
  const qcp_tensor *params; int n_params;   /* params/  */
  const qcp_tensor *saved;  int n_saved;    /* saved/   */
  const qcp_tensor *dy;                     /* the upstream gradient */
  /* Hand back one gradient, named "d_<input or param>" ("d_x", "d_weight").
   * Returns 0, or non-zero if qatcheck could not take it (then return
   * non-zero from the VJP too). */
  int (*emit)(void *host, const char *name, int dtype, int ndim, const int64_t *shape, const void *data);
  void *host;
  char *err;               /* on failure, a one-line message (no newline) */
  size_t err_len;
} qcp_call;

/* The function a plugin exports under the symbol the case names. */
typedef int (*qatcheck_vjp_fn)(const qcp_call *call);

#endif
