/* Backend selection, the public forward entry point (validation, history,
 * dispatch) and the CPU fallback of a session. */
#include "model/backend.h"
#include "model/model.h"
#include "model/session.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

int cpu_forward(glm53_session *s, const int32_t *tokens, int T, float *logits, int all_rows);
int cpu_forward_batch(glm53_session **ss, const int32_t *tokens, int n, float *logits);

static const glm53_backend cpu_backend = {.name = "cpu", .forward = cpu_forward, .forward_batch = cpu_forward_batch};
const glm53_backend *glm53_cpu_backend(void) { return &cpu_backend; }

int glm53_fault_should_fail(const char *site) {
  static atomic_long calls[4];
  static const char *sites[4] = {"forward", "load", "session", "other"};
  const char *spec = getenv("GLM53_FAULT");
  if (!spec || !*spec) return 0;
  int si = 3;
  for (int i = 0; i < 3; i++)
    if (!strcmp(site, sites[i])) si = i;
  long n = atomic_fetch_add(&calls[si], 1) + 1;
  /* spec: comma-separated "site:N" (fail the N-th call) or "site:N+" (N-th and later) */
  size_t sl = strlen(site);
  for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    if (strncmp(p, site, sl) || p[sl] != ':') continue;
    char *end;
    long k = strtol(p + sl + 1, &end, 10);
    if (k > 0 && (n == k || (*end == '+' && n >= k))) return 1;
  }
  return 0;
}

int glm53_backend_select(glm53_model *m, const char *want) {
  if (!want || !*want) want = getenv("GLM53_BACKEND");
  if (!want || !*want) want = "auto";
  if (strcmp(want, "auto") && strcmp(want, "cpu") && strcmp(want, "gpu"))
    return glm53_err("unknown backend '%s' (expected auto, gpu or cpu)", want);
  m->backend = &cpu_backend;
  if (!strcmp(want, "cpu")) {
    LOG_INFO("backend: cpu (requested)");
    return 0;
  }
#ifdef GLM53_HAVE_GPU
  const glm53_backend *g = glm53_gpu_backend();
  if (g->model_init(m) == 0) {
    m->backend = g;
    LOG_INFO("backend: gpu");
    return 0;
  }
  if (!strcmp(want, "gpu")) return glm53_err_ctx("backend gpu unavailable");
  LOG_WARN("backend: cpu (GPU backend unavailable: %s)", glm53_last_error());
  return 0;
#else
  if (!strcmp(want, "gpu")) return glm53_err("backend gpu requested but this build has no GPU support (configure with -DGLM53_CUDA=ON or -DGLM53_HIP=ON)");
  LOG_INFO("backend: cpu (built without GPU support)");
  return 0;
#endif
}

const char *glm53_model_backend(const glm53_model *m) { return m->backend ? m->backend->name : "none"; }
const char *glm53_session_backend(const glm53_session *s) { return s->backend->name; }

int glm53_forward(glm53_session *s, const int32_t *tokens, int T, float *logits, int all_rows) {
  const int V = s->m->cfg.vocab_size;
  if (T <= 0) return glm53_err("forward: empty token list");
  if (s->pos + T > s->max_ctx)
    return glm53_err("prompt too long: %d tokens after %d cached exceed the context of %d", T, s->pos, s->max_ctx);
  for (int t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= V)
      return glm53_err("token id %d at position %d is outside the vocabulary (0..%d)", tokens[t], t, V - 1);
  if (glm53_fault_should_fail("forward"))
    return glm53_err("%s backend error: injected fault (GLM53_FAULT)", s->backend->name);
  if (s->backend->forward(s, tokens, T, logits, all_rows)) return -1;
  memcpy(s->history + s->pos, tokens, (size_t)T * sizeof(int32_t));
  s->pos += T;
  return 0;
}

/* the row of the last failed glm53_forward_batch of this thread, or -1 */
static _Thread_local int g_failed_row = -1;

int glm53_forward_batch(glm53_session **ss, const int32_t *tokens, int n, float *logits) {
  if (n <= 0) return glm53_err("forward_batch: empty batch");
  if (!ss || !tokens || !logits) return glm53_err("forward_batch: NULL sessions, tokens or logits");
  for (int i = 0; i < n; i++)
    if (!ss[i]) return glm53_err("forward_batch: batch row %d has no session", i);
  const glm53_backend *b = ss[0]->backend;
  const int V = ss[0]->m->cfg.vocab_size;
  int same = 1;
  for (int i = 0; i < n; i++) {
    glm53_session *s = ss[i];
    /* logits rows are V apart: a model with another vocabulary would
     * overflow (or misalign) them */
    if (s->m->cfg.vocab_size != V)
      return glm53_err("forward_batch: batch row %d's model has a vocabulary of %d, row 0's of %d", i, s->m->cfg.vocab_size, V);
    if (s->pos + 1 > s->max_ctx)
      return glm53_err("batch row %d: context of %d tokens is full", i, s->max_ctx);
    if (tokens[i] < 0 || tokens[i] >= V)
      return glm53_err("batch row %d: token id %d is outside the vocabulary (0..%d)", i, tokens[i], V - 1);
    if (s->backend != b || s->m != ss[0]->m) same = 0;
    for (int j = 0; j < i; j++)
      if (ss[j] == s) return glm53_err("forward_batch: session given twice (rows %d and %d)", j, i);
  }
  g_failed_row = -1;
  /* the cpu backend's batched forward is opt-in (GLM53_CPU_BATCH=1): its
   * multi-token products dequantize rows and were slower per token than n
   * decode GEMVs where measured (docs/benchmarks.md) */
  const int cpu_loop = b == &cpu_backend && !(getenv("GLM53_CPU_BATCH") && !strcmp(getenv("GLM53_CPU_BATCH"), "1"));
  if (!same || !b->forward_batch || n == 1 || cpu_loop) { /* one by one; stops at the first failure */
    for (int i = 0; i < n; i++)
      if (glm53_forward(ss[i], tokens + i, 1, logits + (size_t)i * V, 0)) {
        g_failed_row = i;
        return -1;
      }
    return 0;
  }
  /* GLM53_FAULT counts one forward per row, as if the rows were stepped one
   * by one (so a test can aim a fault at one request): a fault injected at
   * row i steps rows [0, i) as a batch and fails row i alone */
  int fail_at = -1;
  for (int i = 0; i < n && fail_at < 0; i++)
    if (glm53_fault_should_fail("forward")) fail_at = i;
  const int m = fail_at < 0 ? n : fail_at;
  /* GLM53_FAULT=batch:N fails the N-th batched forward as a whole (no row
   * attributable), the path a device error takes */
  if (m > 1 && glm53_fault_should_fail("batch"))
    return glm53_err("%s backend error: injected batch fault (GLM53_FAULT)", b->name);
  if (m > 0) {
    if (b->forward_batch(ss, tokens, m, logits)) return -1; /* the whole batch failed: no row moved */
    for (int i = 0; i < m; i++) ss[i]->history[ss[i]->pos++] = tokens[i];
  }
  if (fail_at >= 0) {
    g_failed_row = fail_at;
    return glm53_err("%s backend error: injected fault (GLM53_FAULT)", b->name);
  }
  return 0;
}

int glm53_forward_batch_failed_row(void) { return g_failed_row; }

/* history[0..n) through the session's backend in chunks, from a reset state */
static int replay(glm53_session *s, int n) {
  const int chunk = 256;
  glm53_session_reset(s); /* clears the state and pos; history is kept */
  for (int i = 0; i < n; i += chunk) {
    int len = n - i < chunk ? n - i : chunk;
    if (s->backend->forward(s, s->history + i, len, NULL, 0)) {
      s->pos = n; /* the history stays whole for a later fallback */
      return -1;
    }
    s->pos += len;
  }
  return 0;
}

int glm53_session_rebuild(glm53_session *s) {
  if (replay(s, s->pos)) return glm53_err_ctx("rebuilding the session state on %s", s->backend->name);
  return 0;
}

int glm53_session_fallback_cpu(glm53_session *s) {
  int n = s->pos;
  if (s->backend != &cpu_backend && s->backend->session_free) s->backend->session_free(s);
  s->backend = &cpu_backend;
  s->backend_state = NULL;
  session_cpu_state_alloc(s);
  if (replay(s, n)) return glm53_err_ctx("CPU fallback replay");
  LOG_WARN("session moved to the cpu backend (%d tokens of state rebuilt)", n);
  return 0;
}
