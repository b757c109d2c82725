/* l3log.h: layer 3's inputs read from files: per-step logs (JSONL, CSV,
 * TensorBoard event files, Megatron golden values, Hugging Face
 * trainer_state.json; the format chosen by content) and per-arm configs
 * (JSON or YAML). Every reader has an entry point on a memory buffer (for
 * fuzzing) and fills the model's types (model/layer3.h). Bad input is
 * QC_EINPUT with one message naming the file, the line / record / byte and
 * what was expected. */
#ifndef QC_L3LOG_H
#define QC_L3LOG_H

#include <stddef.h>

#include "model/layer3.h"

/* Read an arm's log: a file (format by content) or a folder of TensorBoard
 * event files (events.out.tfevents.*, in name order). out is finished
 * (rows sorted and merged). The step of a JSON record or a CSV row is read
 * from the first of the known step keys it holds (QC_LOG_STEP_KEYS, in that
 * order of preference). */
int qc_log_read(const char *path, qc_l3_log *out);
/* The same, with the step read only from key `step_key` (a case's
 * "step_key", for a writer qatcheck does not know; NULL or "": the known
 * keys). */
int qc_log_read_as(const char *path, const char *step_key, qc_l3_log *out);

/* Parse a log held in memory, format by content; `name` names it in
 * errors. out is finished. */
int qc_log_parse(const char *buf, size_t n, const char *name, qc_l3_log *out);
/* The same with a step key, as qc_log_read_as. */
int qc_log_parse_as(const char *buf, size_t n, const char *name, const char *step_key, qc_l3_log *out);

/* The step keys of the writers qatcheck knows, most preferred first:
 * step (verl, Hugging Face log_history, most JSONL), global_step,
 * Step (a W&B chart export), current_steps (LLaMA-Factory's
 * trainer_log.jsonl), iteration (Megatron-style loggers),
 * train/global_step (the W&B history of a Hugging Face run), _step (W&B's
 * own counter). */
#define QC_LOG_STEP_KEYS "step, global_step, Step, current_steps, iteration, train/global_step, _step"
/* The rank of key name[0..len) among the step keys of log l: 0 for the
 * case's key when l->step_want names one, else its position among the known
 * keys; -1 when it is no step key. */
int qc_log_step_rank(const qc_l3_log *l, const char *name, size_t len);

/* The formats, each on a memory buffer. They add records to `out` (whose
 * path names it in errors) without finishing it, so the event files of a
 * folder can go into one log. */
int qc_log_parse_jsonl(const char *buf, size_t n, qc_l3_log *out);
int qc_log_parse_csv(const char *buf, size_t n, qc_l3_log *out);
int qc_log_parse_tfevents(const char *buf, size_t n, qc_l3_log *out);
int qc_log_parse_megatron(const char *buf, size_t n, qc_l3_log *out);
int qc_log_parse_hf(const char *buf, size_t n, qc_l3_log *out);

/* qc_read_file (core/file.h) reads a whole config or log file. */

/* ---- configs ---------------------------------------------------------------------------- */

/* A canonical key and where to find it in the config ("optimizer.lr": dots
 * walk nested objects; a path equal to the key is the default). */
typedef struct qc_l3_keypath {
  char key[QC_L3_NAME];
  char path[QC_L3_NAME];
} qc_l3_keypath;

/* Read an arm's config (JSON or YAML, by content) and look up each key:
 * out->v[i] is keys[i]'s value, canonical JSON text, or absent. */
int qc_config_read(const char *path, const qc_l3_keypath *keys, int nkeys, qc_l3_config *out);
/* The same on a buffer. */
int qc_config_parse(const char *buf, size_t n, const char *name, const qc_l3_keypath *keys, int nkeys, qc_l3_config *out);

#endif
