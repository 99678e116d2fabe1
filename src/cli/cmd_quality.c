/* glm53 quality: mean NLL / perplexity of a text in windows of --ctx tokens
 * (each window a fresh session; position i predicts token i+1), and with
 * --ref a second model on the same windows: NLL delta and top-1 agreement. */
#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tokenizer.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const quality_opts[] = {"--model=", "--text=", "--tokens-file=", "--ref=", "--ctx=", "--max-tokens=", "--json",
                                           "--backend=", "--threads=", "--help", NULL};

static int read_ids(const char *path, int32_t **ids, size_t *n) {
  size_t len;
  char *txt = read_file(path, &len);
  if (!txt) return -1;
  size_t cap = 256, k = 0;
  int32_t *v = xmalloc(cap * sizeof *v);
  char *p = txt, *end;
  for (;;) {
    while (*p && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) p++;
    if (!*p) break;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0) { free(v); free(txt); return glm53_err("%s: bad token id near '%.16s'", path, p); }
    if (k == cap) v = xrealloc(v, (cap *= 2) * sizeof *v);
    v[k++] = (int32_t)x;
    p = end;
  }
  free(txt);
  *ids = v;
  *n = k;
  return 0;
}

static int tokenize(glm53_model *m, const char *text_path, int32_t **ids, size_t *n) {
  char tp[4096];
  snprintf(tp, sizeof tp, "%s/tokenizer.json", glm53_model_dir(m));
  glm53_tokenizer *t = tok_load(tp);
  if (!t) return glm53_err_ctx("tokenizer (use --tokens-file for models without one)");
  size_t len;
  char *txt = read_file(text_path, &len);
  int rc = txt ? tok_encode(t, txt, len, 0, ids, n) : -1;
  free(txt);
  tok_free(t);
  return rc;
}

/* log-softmax NLL of `target` and argmax of one row */
static double row_nll(const float *l, int V, int target, int *argmax) {
  float mx = l[0];
  int am = 0;
  for (int v = 1; v < V; v++) if (l[v] > mx) { mx = l[v]; am = v; }
  double s = 0;
  for (int v = 0; v < V; v++) s += exp((double)l[v] - mx);
  *argmax = am;
  return log(s) + mx - l[target];
}

int cmd_quality(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 quality --model M (--text FILE | --tokens-file IDS) [--ref M2] [--ctx N] [--max-tokens N] [--json]\n"
           "  Prints tokens, nll_mean, ppl; with --ref also ref_nll_mean, nll_delta, nll_delta_rel, top1_agreement.\n");
    return 0;
  }
  if (cli_check_opts(argc, argv, "quality", quality_opts)) return 2;
  const char *text = cli_opt(argc, argv, "--text"), *tf = cli_opt(argc, argv, "--tokens-file"), *refp = cli_opt(argc, argv, "--ref");
  if (!text == !tf) { fprintf(stderr, "glm53 quality: give exactly one of --text or --tokens-file\n"); return 2; }
  const char *cs = cli_opt(argc, argv, "--ctx"), *ms = cli_opt(argc, argv, "--max-tokens");
  int ctx = cs ? atoi(cs) : 512;
  if (ctx < 2) { fprintf(stderr, "glm53 quality: --ctx must be at least 2\n"); return 2; }
  glm53_model *m = cli_load_model(argc, argv), *r = NULL;
  if (!m) return 1;
  if (refp) {
    glm53_load_opts o = {.backend = cli_opt(argc, argv, "--backend")};
    r = glm53_model_load(refp, &o);
    if (!r) { fprintf(stderr, "glm53 error: %s\n", glm53_last_error()); glm53_model_free(m); return 1; }
  }
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = 1;
  const int V = glm53_model_vocab_size(m);
  float *lm = NULL, *lr = NULL;
  if (tf ? read_ids(tf, &ids, &n) : tokenize(m, text, &ids, &n)) { fprintf(stderr, "glm53 quality: %s\n", glm53_last_error()); goto out; }
  if (ms && (size_t)atol(ms) < n) n = (size_t)atol(ms);
  if (n < 2) { fprintf(stderr, "glm53 quality: need at least 2 tokens, got %zu\n", n); goto out; }
  if (r && glm53_model_vocab_size(r) != V) { fprintf(stderr, "glm53 quality: --ref vocabulary differs\n"); goto out; }
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) { fprintf(stderr, "glm53 quality: token %d outside the vocabulary\n", ids[i]); goto out; }
  lm = xmalloc((size_t)ctx * V * sizeof(float));
  if (r) lr = xmalloc((size_t)ctx * V * sizeof(float));
  double nll = 0, nll_ref = 0;
  size_t count = 0, agree = 0;
  for (size_t w0 = 0; w0 + 1 < n; w0 += (size_t)ctx) {
    int len = (int)(n - w0 < (size_t)ctx ? n - w0 : (size_t)ctx);
    if (len < 2) break;
    glm53_session *s = glm53_session_new(m, len);
    int e = !s || glm53_forward(s, ids + w0, len, lm, 1);
    glm53_session_free(s);
    if (!e && r) {
      s = glm53_session_new(r, len);
      e = !s || glm53_forward(s, ids + w0, len, lr, 1);
      glm53_session_free(s);
    }
    if (e) { fprintf(stderr, "glm53 quality: %s\n", glm53_last_error()); goto out; }
    for (int i = 0; i + 1 < len; i++) {
      int am, ar;
      nll += row_nll(lm + (size_t)i * V, V, ids[w0 + i + 1], &am);
      if (r) {
        nll_ref += row_nll(lr + (size_t)i * V, V, ids[w0 + i + 1], &ar);
        agree += am == ar;
      }
      count++;
    }
  }
  double mean = nll / count, rmean = r ? nll_ref / count : 0;
  if (cli_flag(argc, argv, "--json")) {
    printf("{\"tokens\":%zu,\"scored\":%zu,\"ctx\":%d,\"nll_mean\":%.6f,\"ppl\":%.6f", n, count, ctx, mean, exp(mean));
    if (r) printf(",\"ref_nll_mean\":%.6f,\"nll_delta\":%.6f,\"nll_delta_rel\":%.6f,\"top1_agreement\":%.6f", rmean, mean - rmean,
                  (mean - rmean) / rmean, (double)agree / count);
    printf("}\n");
  } else {
    printf("tokens %zu\nscored %zu\nctx %d\nnll_mean %.6f\nppl %.6f\n", n, count, ctx, mean, exp(mean));
    if (r) printf("ref_nll_mean %.6f\nnll_delta %.6f\nnll_delta_rel %.6f\ntop1_agreement %.6f\n", rmean, mean - rmean, (mean - rmean) / rmean,
                  (double)agree / count);
  }
  rc = 0;
out:
  free(ids); free(lm); free(lr);
  glm53_model_free(m);
  glm53_model_free(r);
  return rc;
}
