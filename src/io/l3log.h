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
 * (rows sorted and merged). */
int qc_log_read(const char *path, qc_l3_log *out);

/* Parse a log held in memory, format by content; `name` names it in
 * errors. out is finished. */
int qc_log_parse(const char *buf, size_t n, const char *name, qc_l3_log *out);

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
