/* glm53 quality: mean NLL / perplexity of a text in windows of --ctx tokens
 * (each window a fresh session; position i predicts token i+1), and with
 * --ref a second model on the same windows: NLL delta and top-1 agreement.
 * --compare-backends runs the same model on the cpu and gpu backends: NLL
 * delta, bitwise determinism of two GPU runs, greedy-token agreement. */
#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const quality_opts[] = {"--model=", "--text=", "--tokens-file=", "--ref=", "--ctx=", "--max-tokens=", "--json",
                                           "--backend=", "--threads=", "--compare-backends", "--greedy-tokens=", "--help", NULL};

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

typedef struct { int32_t *ids; int n, cap; } tok_sink;

static int collect(void *u, const gen_token *t) {
  tok_sink *k = u;
  if (t->token >= 0 && k->n < k->cap) k->ids[k->n++] = t->token;
  return 0;
}

/* Greedy continuation of prompt on model m: up to n_gen tokens (eos ignored);
 * returns how many were produced, or -1. */
static int greedy(glm53_model *m, const int32_t *prompt, int n_prompt, int n_gen, int32_t *out) {
  glm53_session *s = glm53_session_new(m, n_prompt + n_gen + 1);
  if (!s) return -1;
  gen_params p;
  gen_params_default(&p);
  p.sp.temperature = 0;
  p.max_tokens = n_gen;
  p.ignore_eos = 1;
  tok_sink k = {out, 0, n_gen};
  int rc = gen_run(s, NULL, prompt, n_prompt, &p, collect, &k, NULL);
  glm53_session_free(s);
  return rc ? -1 : k.n;
}

/* --compare-backends: greedy agreement of the two backends, printed. */
static int compare_greedy(glm53_model *cpu, glm53_model *gpu, const int32_t *ids, size_t n, int n_gen, int json) {
  int np = n < 32 ? (int)n : 32;
  int32_t *a = xmalloc((size_t)n_gen * sizeof *a), *b = xmalloc((size_t)n_gen * sizeof *b);
  int na = greedy(cpu, ids, np, n_gen, a), nb = na < 0 ? -1 : greedy(gpu, ids, np, n_gen, b);
  if (na < 0 || nb < 0) {
    free(a); free(b);
    return glm53_err_ctx("greedy comparison");
  }
  int same = 0, prefix = -1, len = na < nb ? na : nb;
  for (int i = 0; i < len; i++) {
    if (a[i] == b[i]) same++;
    else if (prefix < 0) prefix = i;
  }
  if (prefix < 0) prefix = len;
  if (json) printf(",\"greedy_tokens\":%d,\"greedy_agree\":%d,\"greedy_common_prefix\":%d", len, same, prefix);
  else printf("greedy_tokens %d\ngreedy_agree %d\ngreedy_common_prefix %d\n", len, same, prefix);
  free(a); free(b);
  return 0;
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
    printf("usage: glm53 quality --model M (--text FILE | --tokens-file IDS) [--ref M2 | --compare-backends [--greedy-tokens N]]\n"
           "                     [--ctx N] [--max-tokens N] [--json]\n"
           "  Prints tokens, nll_mean, ppl; with --ref also ref_nll_mean, nll_delta, nll_delta_rel, top1_agreement.\n"
           "  --compare-backends: M on the cpu backend is the reference and M on the gpu backend the model under test;\n"
           "  also prints gpu_bitwise_deterministic (two GPU runs of every window) and greedy agreement over N tokens (256).\n");
    return 0;
  }
  if (cli_check_opts(argc, argv, "quality", quality_opts)) return 2;
  const char *text = cli_opt(argc, argv, "--text"), *tf = cli_opt(argc, argv, "--tokens-file"), *refp = cli_opt(argc, argv, "--ref");
  if (!text == !tf) { fprintf(stderr, "glm53 quality: give exactly one of --text or --tokens-file\n"); return 2; }
  const char *cs = cli_opt(argc, argv, "--ctx"), *ms = cli_opt(argc, argv, "--max-tokens");
  int ctx = cs ? atoi(cs) : 512;
  if (ctx < 2) { fprintf(stderr, "glm53 quality: --ctx must be at least 2\n"); return 2; }
  const int cmp = cli_flag(argc, argv, "--compare-backends");
  if (cmp && (refp || cli_opt(argc, argv, "--backend"))) {
    fprintf(stderr, "glm53 quality: --compare-backends picks the backends itself (no --ref/--backend)\n");
    return 2;
  }
  glm53_model *m, *r = NULL;
  if (cmp) { /* m = gpu (under test), r = cpu (reference) */
    const char *path = cli_opt(argc, argv, "--model");
    if (!path) path = cli_default_model();
    glm53_load_opts og = {.backend = "gpu"}, oc = {.backend = "cpu"};
    m = glm53_model_load(path, &og);
    if (m) r = glm53_model_load(path, &oc);
    if (!m || !r) {
      fprintf(stderr, "glm53 error: --compare-backends: %s\n", glm53_last_error());
      glm53_model_free(m);
      return 1;
    }
    refp = path;
  } else {
    m = cli_load_model(argc, argv);
    if (!m) return 1;
  }
  if (refp && !r) {
    glm53_load_opts o = {.backend = cli_opt(argc, argv, "--backend")};
    r = glm53_model_load(refp, &o);
    if (!r) { fprintf(stderr, "glm53 error: %s\n", glm53_last_error()); glm53_model_free(m); return 1; }
  }
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = 1;
  const int V = glm53_model_vocab_size(m);
  float *lm = NULL, *lr = NULL, *l2 = NULL;
  int bitwise = 1;
  if (tf ? read_ids(tf, &ids, &n) : tokenize(m, text, &ids, &n)) { fprintf(stderr, "glm53 quality: %s\n", glm53_last_error()); goto out; }
  if (ms && (size_t)atol(ms) < n) n = (size_t)atol(ms);
  if (n < 2) { fprintf(stderr, "glm53 quality: need at least 2 tokens, got %zu\n", n); goto out; }
  if (r && glm53_model_vocab_size(r) != V) { fprintf(stderr, "glm53 quality: --ref vocabulary differs\n"); goto out; }
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) { fprintf(stderr, "glm53 quality: token %d outside the vocabulary\n", ids[i]); goto out; }
  lm = xmalloc((size_t)ctx * V * sizeof(float));
  if (r) lr = xmalloc((size_t)ctx * V * sizeof(float));
  if (cmp) l2 = xmalloc((size_t)ctx * V * sizeof(float));
  double nll = 0, nll_ref = 0;
  size_t count = 0, agree = 0;
  for (size_t w0 = 0; w0 + 1 < n; w0 += (size_t)ctx) {
    int len = (int)(n - w0 < (size_t)ctx ? n - w0 : (size_t)ctx);
    if (len < 2) break;
    glm53_session *s = glm53_session_new(m, len);
    int e = !s || glm53_forward(s, ids + w0, len, lm, 1);
    glm53_session_free(s);
    if (!e && cmp) { /* a second GPU run must give the same bits */
      s = glm53_session_new(m, len);
      e = !s || glm53_forward(s, ids + w0, len, l2, 1);
      glm53_session_free(s);
      if (!e && memcmp(lm, l2, (size_t)len * V * sizeof(float))) bitwise = 0;
    }
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
  const int json = cli_flag(argc, argv, "--json");
  if (json) {
    printf("{\"tokens\":%zu,\"scored\":%zu,\"ctx\":%d,\"nll_mean\":%.6f,\"ppl\":%.6f", n, count, ctx, mean, exp(mean));
    if (r) printf(",\"ref_nll_mean\":%.6f,\"nll_delta\":%.6f,\"nll_delta_rel\":%.6f,\"top1_agreement\":%.6f", rmean, mean - rmean,
                  (mean - rmean) / rmean, (double)agree / count);
    if (cmp) printf(",\"gpu_bitwise_deterministic\":%s", bitwise ? "true" : "false");
  } else {
    printf("tokens %zu\nscored %zu\nctx %d\nnll_mean %.6f\nppl %.6f\n", n, count, ctx, mean, exp(mean));
    if (r) printf("ref_nll_mean %.6f\nnll_delta %.6f\nnll_delta_rel %.6f\ntop1_agreement %.6f\n", rmean, mean - rmean, (mean - rmean) / rmean,
                  (double)agree / count);
    if (cmp) printf("gpu_bitwise_deterministic %s\n", bitwise ? "yes" : "no");
  }
  if (cmp) {
    const char *gs = cli_opt(argc, argv, "--greedy-tokens");
    int ng = gs ? atoi(gs) : 256;
    if (ng < 1 || compare_greedy(r, m, ids, n, ng, json)) {
      fprintf(stderr, "glm53 quality: %s\n", ng < 1 ? "--greedy-tokens must be positive" : glm53_last_error());
      if (json) printf("}\n");
      goto out;
    }
  }
  if (json) printf("}\n");
  rc = 0;
out:
  free(ids); free(lm); free(lr); free(l2);
  glm53_model_free(m);
  glm53_model_free(r);
  return rc;
}
