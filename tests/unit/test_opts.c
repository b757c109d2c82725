/* test_opts.c: the verbs' option parser (src/cli/opts.h): both spellings of
 * a value, the messages of an unknown option, a missing value and a value
 * given to a flag, a value that starts with '-', numbers in their declared
 * range, positional arguments and `--`, sub-modes, the pre-pass
 * (qc_opts_scan) reading argv as the parse does, and the help generated
 * from the same table (every listed option is parsed, every parsed one
 * listed but the hidden). */
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
  double k, x;
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
      {.type = QC_OT_NUMBER, .name = "k", .value = &v->k, .argh = "K", .lo = 1, .hi = QC_NUM_HUGE, .flags = QC_OPT_WHOLE,
       .help = "a count", .modes = 1},
      QC_OPT_NUMBER("x", &v->x, "X", -1, 1, "a number from -1 to 1"),
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
  const char *a[] = {"verb", "--path", "a", "--path=b", "--flag", "--k=3", "--fmt=--json", "--x", "-0.5", NULL};
  cr_assert_eq(parse(a, &v, &p, 0), QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(v.path, "b");
  cr_expect_eq(v.flag, 1);
  cr_expect_eq(v.k, 3);
  cr_expect_str_eq(v.fmt, "--json"); /* --name=VALUE: a value that starts with '-' */
  cr_expect_eq(v.x, -0.5);           /* a NUMBER option's negative number is a value */
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
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '2.5': expected a whole number from 1 to 1e15");
  qc_opts_free(&p);
  const char *low[] = {"verb", "--k=0", NULL};
  cr_expect_eq(parse(low, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '0': expected a whole number from 1 to 1e15");
  qc_opts_free(&p);
  const char *high[] = {"verb", "--x", "1.5", NULL};
  cr_expect_eq(parse(high, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--x' is '1.5': expected a number from -1 to 1");
  qc_opts_free(&p);
  const char *huge[] = {"verb", "--k", "4294967299e9", NULL}; /* no wrap, no cast: refused */
  cr_expect_eq(parse(huge, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '4294967299e9': expected a whole number from 1 to 1e15");
  qc_opts_free(&p);
  const char *nan[] = {"verb", "--x=nan", NULL};
  cr_expect_eq(parse(nan, &v, &p, 0), QC_EINPUT);
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

Test(opts, a_value_that_starts_with_a_dash) {
  vals v;
  qc_opts p;
  const char *flag[] = {"verb", "--path", "--flag", NULL};
  cr_expect_eq(parse(flag, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--path' needs a value: '--flag' starts with '-' (give it as --path=--flag if it is one)");
  cr_expect_null(v.path);
  cr_expect_eq(v.flag, 0);
  qc_opts_free(&p);
  const char *repro[] = {"verb", "--json", "--path", "x.json", NULL}; /* qatcheck vjp --json --case x.json */
  cr_expect_eq(parse(repro, &v, &p, 0), QC_EINPUT);
  cr_expect_null(v.co.json);
  qc_opts_free(&p);
  const char *dash[] = {"verb", "--path", "-", NULL};
  cr_expect_eq(parse(dash, &v, &p, 0), QC_EINPUT);
  qc_opts_free(&p);
  const char *eq[] = {"verb", "--path=-", "--json=-r.json", NULL};
  cr_expect_eq(parse(eq, &v, &p, 0), QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(v.path, "-");
  cr_expect_str_eq(v.co.json, "-r.json");
  qc_opts_free(&p);
  const char *neg[] = {"verb", "--k", "-3", NULL}; /* a number: the value, refused by its range */
  cr_expect_eq(parse(neg, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' is '-3': expected a whole number from 1 to 1e15");
  qc_opts_free(&p);
  const char *negopt[] = {"verb", "--k", "--flag", NULL}; /* not a number: the next option */
  cr_expect_eq(parse(negopt, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--k' needs a value: '--flag' starts with '-' (give it as --k=--flag if it is one)");
  qc_opts_free(&p);
  qc_err_clear();
}

Test(opts, double_dash_ends_the_options) {
  vals v;
  qc_opts p;
  g_helped = 0;
  const char *end[] = {"verb", "--flag", "--", NULL};
  cr_expect_eq(parse(end, &v, &p, 0), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(v.flag, 1);
  qc_opts_free(&p);
  const char *after[] = {"verb", "--", "--flag", NULL};
  cr_expect_eq(parse(after, &v, &p, 0), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "verb: unexpected argument '--flag' after '--': it takes no arguments");
  cr_expect_eq(v.flag, 0);
  qc_opts_free(&p);
  const char *pos[] = {"verb", "a", "--", "--flag", "-h", "-", "--", NULL};
  cr_assert_eq(parse(pos, &v, &p, 1), QC_OK, "%s", qc_err_msg());
  const char *in[8];
  int n;
  qc_opts_args(&p, in, &n);
  cr_assert_eq(n, 5);
  cr_expect_str_eq(in[1], "--flag");
  cr_expect_str_eq(in[2], "-h");
  cr_expect_str_eq(in[4], "--");
  cr_expect_eq(v.flag, 0);
  cr_expect_eq(g_helped, 0);
  qc_opts_free(&p);
  qc_err_clear();
}

/* The index of the table entry named name. */
static int entry(const qc_opts *p, const char *name) {
  for (int e = 0; p->opt[e].type != QC_OT_END; e++)
    if (p->opt[e].name && strcmp(p->opt[e].name, name) == 0) return e;
  cr_assert_fail("no entry '%s'", name);
  return -1;
}

/* The pre-pass over args (NULL-terminated) with parse()'s table: its status, val filled. */
static int scan(const char **args, vals *v, qc_opts *p, const char **val, int nval) {
  const char *none[] = {"verb", NULL};
  cr_assert_eq(parse(none, v, p, 0), QC_OK);
  for (int i = 0; i < nval; i++) val[i] = NULL;
  int argc = 0;
  while (args[argc]) argc++;
  qc_err_clear();
  return qc_opts_scan(p, argc, (char **)args, val);
}

Test(opts, the_pre_pass_reads_as_the_parse_does) {
  vals v;
  qc_opts p;
  const char *val[32];
  g_helped = 0;
  /* unknown options and stray arguments kept (skipped), the last value wins, nothing stored */
  const char *keep[] = {"verb", "--bogus", "--json", "r1", "stray", "--json=r2", "--fmt", "f", "-q", NULL};
  cr_expect_eq(scan(keep, &v, &p, val, 32), QC_OK, "%s", qc_err_msg());
  cr_expect_str_eq(val[entry(&p, "json")], "r2");
  cr_expect_str_eq(val[entry(&p, "fmt")], "f");
  cr_expect_str_eq(val[entry(&p, "quiet")], "");
  cr_expect_null(val[entry(&p, "path")]);
  cr_expect_null(v.co.json);
  cr_expect_null(v.fmt);
  qc_opts_free(&p);
  /* the two reproductions of issue 37: no report path is read */
  const char *r1[] = {"verb", "--json", "--path", "x.json", NULL};
  cr_expect_eq(scan(r1, &v, &p, val, 32), QC_EINPUT);
  cr_expect_null(val[entry(&p, "json")]);
  cr_expect_null(val[entry(&p, "path")]);
  qc_opts_free(&p);
  const char *r2[] = {"verb", "--path", "--json", "x.json", NULL}; /* qatcheck tol --dump --json x.json */
  cr_expect_eq(scan(r2, &v, &p, val, 32), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "option '--path' needs a value: '--json' starts with '-' (give it as --path=--json if it is one)");
  cr_expect_null(val[entry(&p, "json")]);
  qc_opts_free(&p);
  /* what came before the error is read, nothing after it */
  const char *before[] = {"verb", "--json", "a.json", "--path", "--x", "--junit", "b.xml", NULL};
  cr_expect_eq(scan(before, &v, &p, val, 32), QC_EINPUT);
  cr_expect_str_eq(val[entry(&p, "json")], "a.json");
  cr_expect_null(val[entry(&p, "junit")]);
  qc_opts_free(&p);
  /* after `--` nothing is an option; at --help the reading stops, printing nothing */
  const char *dd[] = {"verb", "--", "--json", "r.json", NULL};
  cr_expect_eq(scan(dd, &v, &p, val, 32), QC_OK);
  cr_expect_null(val[entry(&p, "json")]);
  qc_opts_free(&p);
  const char *help[] = {"verb", "--junit", "a.xml", "-h", "--json", "r.json", NULL};
  cr_expect_eq(scan(help, &v, &p, val, 32), QC_OK);
  cr_expect_str_eq(val[entry(&p, "junit")], "a.xml");
  cr_expect_null(val[entry(&p, "json")]);
  cr_expect_eq(g_helped, 0);
  cr_expect_eq(p.done, 0);
  qc_opts_free(&p);
  /* the report kinds of the common table */
  cr_expect_eq(p.opt[entry(&p, "json")].report, QC_REP_JSON + 1);
  cr_expect_eq(p.opt[entry(&p, "junit")].report, QC_REP_JUNIT + 1);
  cr_expect_eq(p.opt[entry(&p, "markdown")].report, QC_REP_MARKDOWN + 1);
  cr_expect_eq(p.opt[entry(&p, "path")].report, 0);
  qc_err_clear();
}
