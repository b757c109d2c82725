/* l3json.h: inside model/, the small JSON readers layer 3's case files
 * share (l3case.c, stepcase.c): keys checked against a list, typed values
 * with messages naming the case and the key, paths resolved, files read. */
#ifndef QC_L3JSON_H
#define QC_L3JSON_H

#include <cJSON.h>
#include <stddef.h>

/* Refuse a key of obj that is not in the NULL-terminated `allowed`, or a
 * repeated key, naming it and listing the allowed ones. */
int qc_lj_keys(const cJSON *obj, const char *const *allowed, const char *where);
/* obj[key] as a string into out[0..n) (absent: QC_OK, *found 0). */
int qc_lj_str(const cJSON *obj, const char *key, const char *where, char *out, size_t n, int *found);
/* obj[key] as a finite number, >= lo (absent: QC_OK, *found 0). */
int qc_lj_num(const cJSON *obj, const char *key, const char *where, double lo, double *out, int *found);
/* A path relative to dir, resolved into out[0..n) (never truncated). */
int qc_lj_resolve(const char *dir, const char *p, char *out, size_t n);
/* The start every layer-3 case shares: parse text into *root (deleted by
 * the caller, also on error), check it is an object of the keys in `top`,
 * read `name` (default: the file name without its extension) and check
 * `description`. w receives "case 'WHERE'" for messages. */
int qc_lj_case_begin(const char *text, const char *where, const char *const *top, cJSON **root, char *w, size_t wn, char *name,
                     size_t nn);
/* Load a case file and parse it with parse(text, path, dir, c); on success
 * its SHA-256 goes into sha (65 bytes). */
int qc_lj_case_load(const char *path, int (*parse)(const char *, const char *, const char *, void *), void *c, char *sha);

#endif
