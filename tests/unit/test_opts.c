/* test_opts.c: the verbs' option parser (src/cli/opts.h): both spellings of
 * a value, the messages of an unknown option, a missing value and a value
 * given to a flag, numbers, positional arguments, sub-modes, and the help
 * generated from the same table (every listed option is parsed, every
 * parsed one listed but the hidden). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/opts.h"
#include "core/qc.h"

static int g_helped;
/* A help that only counts its calls. */
static void count_help(const qc_opts *p) {
  (void)p;
  g_helped++;
}

typedef struct vals {
  const char *path, *fmt;
  int flag;
  double k;
  qc_common_opts co;
} vals;

/* Parse argv (NULL-terminated) against a small table; returns the status,
 * the values in *v, the parse in *p (freed by the caller). */
static int parse(const char **args, vals *v, qc_opts *p, int positional) {
  static qc_opt opts[32];
  qc_opt t[] = {
      QC_OPT_STRING("path", &v->path, "PATH", "a path"),
      {.type = QC_OT_STRING, .name = "fmt", .value = &v->fmt, .argh = "F", .help = "a format", .modes = 2},
      QC_OPT_BOOL("flag", &v->flag, "a flag"),
      {.type = QC_OT_NUMBER, .name = "k", .value = &v->k, .argh = "K", .lo = 1, .flags = QC_OPT_WHOLE, .help = "a count",
       .modes = 1},
      QC_OPTS_COMMON(&v->co, QC_HELP_MARKDOWN),
      QC_OPT_END(),
  };
  cr_assert_leq(sizeof t / sizeof t[0], 32);
  memcpy(opts, t, sizeof t);
  memset(v, 0, sizeof *v);
  int argc = 0;
  while (args[argc]) argc++;
  *p = (qc_opts){.verb = "verb", .opt = opts, .help = count_help, .positional = positional};
  qc_err_clear();
  return qc_opts_parse(p, argc, (char **)args);
}

Test(opts, both_spellings_and_the_last_wins) {
  vals v;
  qc_opts p;
  const char *a[] = {"verb", "--path", "a", "--path=b", "--flag", "--k=3", "--fmt", "--json", NULL};
  cr_assert_eq(parse(a, &v, &p, 0), QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(v.path, "b");
  cr_expect_eq(v.flag, 1);
  cr_expect_eq(v.k, 3);
  cr_expect_str_eq(v.fmt, "--json"); /* a value is the next argument, whatever it looks like */
  cr_expect_null(v.co.json);
  cr_expect(qc_opts_given(&p, "k"));
  cr_expect(!qc_opts_given(&p, "json"));
  qc_opts_free(&p);
}

Test(opts, messages) {
  vals v;
  qc_opts p;
  const char *unknown[] = {"verb", "--path", "a", "--bogus", NULL};
  cr_expect_eq(parse(unknown, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "verb: unknown option '--bogus'");
  cr_expect_str_eq(qc_err_hint(), "run 'qatcheck verb --help'");
  qc_opts_free(&p);
  const char *missing[] = {"verb", "--path", NULL};
  cr_expect_eq(parse(missing, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--path' needs a value");
  qc_opts_free(&p);
  const char *flagval[] = {"verb", "--flag=1", NULL};
  cr_expect_eq(parse(flagval, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--flag' takes no value: '--flag=1'");
  qc_opts_free(&p);
  const char *whole[] = {"verb", "--k", "2.5", NULL};
  cr_expect_eq(parse(whole, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '2.5': expected a whole number");
  qc_opts_free(&p);
  const char *low[] = {"verb", "--k=0", NULL};
  cr_expect_eq(parse(low, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '0': expected a number of at least 1");
  qc_opts_free(&p);
  const char *pos[] = {"verb", "in.json", NULL};
  cr_expect_eq(parse(pos, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "verb: unknown option 'in.json'");
  qc_opts_free(&p);
  qc_err_clear();
}

Test(opts, help_positional_and_modes) {
  vals v;
  qc_opts p;
  g_helped = 0;
  const char *help[] = {"verb", "--path", "a", "-h", "--bogus", NULL};
  cr_expect_eq(parse(help, &v, &p, 0), QC_OK);
  cr_expect(p.done);
  cr_expect_eq(g_helped, 1);
  qc_opts_free(&p);
  const char *pos[] = {"verb", "a.json", "--fmt", "x", "b.json", "--k", "2", NULL};
  cr_assert_eq(parse(pos, &v, &p, 1), QC_OK);
  const char *in[8];
  int n;
  qc_opts_args(&p, in, &n);
  cr_assert_eq(n, 2);
  cr_expect_str_eq(in[0], "a.json");
  cr_expect_str_eq(in[1], "b.json");
  cr_expect_eq(qc_opts_outside(&p, 1), 2);     /* --fmt is mode 2's */
  cr_expect_eq(qc_opts_outside(&p, 2), 5);     /* --k is mode 1's */
  cr_expect_eq(qc_opts_outside(&p, 1 | 2), 0);
  qc_opts_free(&p);
}

Test(opts, help_lists_the_table) {
  vals v;
  qc_opts p;
  const char *none[] = {"verb", NULL};
  cr_assert_eq(parse(none, &v, &p, 0), QC_OK);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  FILE *saved = stdout;
  stdout = f;
  qc_opts_help(p.opt, 21);
  stdout = saved;
  fclose(f);
  char *all = malloc(len + 2); /* a newline first: every option's line starts after one */
  cr_assert_not_null(all);
  all[0] = '\n';
  memcpy(all + 1, buf, len + 1);
  free(buf);
  buf = all;
  for (const qc_opt *o = p.opt; o->type != QC_OT_END; o++) {
    if (!o->name) continue;
    char line[64];
    snprintf(line, sizeof line, "\n  --%s", o->name);
    if (o->flags & QC_OPT_HIDDEN) cr_expect_null(strstr(buf, line), "hidden --%s listed", o->name);
    else cr_expect_not_null(strstr(buf, line), "--%s not listed:\n%s", o->name, buf);
  }
  cr_expect_not_null(strstr(buf, "  --path PATH        a path\n"), "%s", buf);
  cr_expect_not_null(strstr(buf, "\ncommon options:\n"), "%s", buf);
  cr_expect_not_null(strstr(buf, "(default 21600 = 6 h; 0: no limit)"), "%s", buf);
  cr_expect_null(strstr(buf, "--profile"), "--profile is hidden without QC_HELP_PROFILE");
  free(buf);
  qc_opts_free(&p);
}
