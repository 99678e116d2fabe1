/* glm53 eval: the golden-comparison contract (docs/design.md). Prefills the
 * tokens (or the first --decode-from N of them), feeds the rest one at a time
 * through the cache, and writes every position's logits as raw float32. */
#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const eval_opts[] = {"--model=", "--tokens=", "--backend=", "--threads=", "--dump-logits=",
                                        "--decode-from=", "--ctx=", "--chunk=", "--help", NULL};

static int parse_tokens(const char *s, int32_t **out, int *n) {
  int cap = 16, k = 0;
  int32_t *v = xmalloc(cap * sizeof(int32_t));
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (end == p || errno || x < 0 || x > INT32_MAX) { free(v); return glm53_err("--tokens: bad token id near '%.20s'", p); }
    if (k == cap) v = xrealloc(v, (cap *= 2) * sizeof(int32_t));
    v[k++] = (int32_t)x;
    p = end;
    if (*p == ',') p++;
    else if (*p) { free(v); return glm53_err("--tokens: expected ',' near '%.20s'", p); }
  }
  if (!k) { free(v); return glm53_err("--tokens: no tokens given"); }
  *out = v;
  *n = k;
  return 0;
}

int cmd_eval(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 eval --model PATH --tokens 1,2,3 [--dump-logits FILE] [--decode-from N] [--chunk C] [--ctx N] [--backend cpu|gpu]\n"
           "  Prefills tokens [0,N) (all if no --decode-from) in chunks of C (default: one chunk),\n"
           "  then decodes the rest one token at a time; writes one float32 row of vocab logits per position.\n");
    return 0;
  }
  if (cli_check_opts(argc, argv, "eval", eval_opts)) return 2;
  const char *toks = cli_opt(argc, argv, "--tokens");
  if (!toks) { fprintf(stderr, "glm53 eval: --tokens is required\n"); return 2; }
  int32_t *ids = NULL;
  int n = 0;
  if (parse_tokens(toks, &ids, &n)) { fprintf(stderr, "glm53 eval: %s\n", glm53_last_error()); return 2; }
  int dfrom = n;
  const char *df = cli_opt(argc, argv, "--decode-from");
  if (df) {
    dfrom = atoi(df);
    if (dfrom < 1 || dfrom > n) { fprintf(stderr, "glm53 eval: --decode-from must be in 1..%d\n", n); free(ids); return 2; }
  }
  const char *cs = cli_opt(argc, argv, "--chunk");
  int chunk = cs ? atoi(cs) : dfrom;
  if (chunk < 1) { fprintf(stderr, "glm53 eval: --chunk must be positive\n"); free(ids); return 2; }
  glm53_model *m = cli_load_model(argc, argv);
  if (!m) { free(ids); return 1; }
  const char *ctxs = cli_opt(argc, argv, "--ctx");
  int ctx = ctxs ? atoi(ctxs) : n;
  int rc = 1;
  glm53_session *s = glm53_session_new(m, ctx);
  const int V = glm53_model_vocab_size(m);
  float *logits = xmalloc((size_t)n * V * sizeof(float));
  if (!s) goto out;
  for (int i = 0; i < dfrom; i += chunk) {
    int len = dfrom - i < chunk ? dfrom - i : chunk;
    if (glm53_forward(s, ids + i, len, logits + (size_t)i * V, 1)) goto out;
  }
  for (int i = dfrom; i < n; i++)
    if (glm53_forward(s, ids + i, 1, logits + (size_t)i * V, 1)) goto out;
  const char *dump = cli_opt(argc, argv, "--dump-logits");
  if (dump) {
    if (write_file_atomic(dump, logits, (size_t)n * V * sizeof(float))) goto out;
  } else {
    for (int i = 0; i < n; i++) { /* greedy next token per position */
      int best = 0;
      for (int v = 1; v < V; v++) if (logits[(size_t)i * V + v] > logits[(size_t)i * V + best]) best = v;
      printf("%d%c", best, i + 1 < n ? ',' : '\n');
    }
  }
  rc = 0;
out:
  if (rc) fprintf(stderr, "glm53 error: %s\n", glm53_last_error());
  free(logits);
  free(ids);
  glm53_session_free(s);
  glm53_model_free(m);
  return rc;
}
