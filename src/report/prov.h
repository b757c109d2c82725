/* prov.h: a run's provenance, as every report records it: the command line
 * as given and the input files (role, path, size, SHA-256). Each input is
 * hashed on a thread beside the run; the hashes are joined when a report is
 * rendered. The run (run.h) owns one qc_prov and hands it to the renderers
 * (qc_report_out's prov); a renderer given NULL records an empty
 * provenance (no command line, no inputs). */
#ifndef QC_REPORT_PROV_H
#define QC_REPORT_PROV_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "report/sbuf.h"

struct cJSON;
typedef struct qc_prov_input qc_prov_input;

typedef struct qc_prov {
  int argc;
  char **argv;           /* the command line (argv[0] the verb), not owned */
  int ninput;
  qc_prov_input **in;    /* each its own allocation: a hashing thread holds it */
  atomic_int cancel;     /* stop hashing: the run ends without a report that needs it */
  pthread_mutex_t join;  /* each hashing thread is joined once, from any thread */
} qc_prov;

/* Start an empty provenance of the command line argc/argv (kept by pointer). */
void qc_prov_init(qc_prov *p, int argc, char **argv);
/* 1 when the file (dev, ino) is an input in role `role` already, else 0. */
int qc_prov_has(const qc_prov *p, const char *role, dev_t dev, ino_t ino);
/* Record input `path` in role `role` with its size from st, and start
 * hashing it (on a thread; here when none can be started). QC_OK or
 * QC_ESYS (out of memory, nothing recorded). */
int qc_prov_add(qc_prov *p, const char *role, const char *path, long long size, dev_t dev, ino_t ino);
/* Stop hashing (an error report carries no hashes worth waiting for): the
 * inputs not hashed yet are recorded without a digest. */
void qc_prov_stop(qc_prov *p);
/* Join and free every input; p is empty afterwards. */
void qc_prov_free(qc_prov *p);

/* Add "command_line" (the argv as given) and "inputs" ([{role, path, size,
 * sha256}]: waits for the hashes) to a JSON report; p may be NULL. */
void qc_prov_json(qc_prov *p, struct cJSON *root);
/* The same for Markdown: the command line and every input, as list items. */
void qc_prov_markdown(qc_prov *p, qc_sbuf *b);
/* The command line as one shell-quoted string into b ("qatcheck" when p
 * is NULL). */
void qc_prov_cmdline(const qc_prov *p, qc_sbuf *b);

#endif
