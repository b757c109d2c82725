/* vjp.c: layer 1 (being written). */
#include "../qc.h"
#include "cli.h"
int qc_cmd_vjp(int argc, char **argv) { (void)argc; (void)argv; return qc_err("vjp: not yet built"); }
