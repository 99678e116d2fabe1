/* Dense SwiGLU MLP and the routed MoE: fp32 sigmoid router with correction
 * bias (selection only), group-limited top-k with deterministic ties,
 * normalised and scaled weights, clamped SwiGLU experts, shared expert. */
#include "model/layers.h"
#include "model/ops.h"
#include "core/util.h"
#include <stdlib.h>

static int before(float a, int ia, float b, int ib) {
  if (isnan(a)) a = -INFINITY;
  if (isnan(b)) b = -INFINITY;
  return a != b ? a > b : ia < ib;
}

/* indices of the k best of v[0..n) (by `before`), restricted to allowed[i] != 0 */
static void topk_masked(const float *v, const unsigned char *allowed, int n, int k, int *out) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (allowed && !allowed[i]) continue;
    if (m == k && !before(v[i], i, v[out[m - 1]], out[m - 1])) continue;
    int j = m < k ? m++ : k - 1;
    while (j > 0 && before(v[i], i, v[out[j - 1]], out[j - 1])) { out[j] = out[j - 1]; j--; }
    out[j] = i;
  }
  for (; m < k; m++) out[m] = -1;
}

void moe_route(const glm53_config *c, const float *logits, const float *bias, int *idx, float *wt) {
  const int E = c->n_routed_experts, k = c->num_experts_per_tok, G = c->n_group, per = E / G;
  float *sig = xmalloc((size_t)E * sizeof(float)), *choice = xmalloc((size_t)E * sizeof(float));
  for (int e = 0; e < E; e++) {
    sig[e] = sigmoidf_(logits[e]);
    choice[e] = sig[e] + bias[e];
  }
  unsigned char *allowed = NULL;
  if (G > 1) { /* group score = sum of the group's two best choice scores */
    float *gs = xmalloc((size_t)G * sizeof(float));
    int *gsel = xmalloc((size_t)c->topk_group * sizeof(int)), best[2];
    for (int g = 0; g < G; g++) {
      int n2 = per < 2 ? per : 2;
      topk_masked(choice + g * per, NULL, per, n2, best);
      gs[g] = 0;
      for (int i = 0; i < n2; i++) gs[g] += choice[g * per + best[i]];
    }
    topk_masked(gs, NULL, G, c->topk_group, gsel);
    allowed = xcalloc((size_t)E, 1);
    for (int i = 0; i < c->topk_group; i++)
      for (int e = 0; e < per; e++) allowed[gsel[i] * per + e] = 1;
    free(gs);
    free(gsel);
  }
  topk_masked(choice, allowed, E, k, idx);
  /* (top-k above the allowed experts leaves ids -1: weight 0, as on the GPU) */
  double sum = 0;
  for (int i = 0; i < k; i++) sum += idx[i] >= 0 ? sig[idx[i]] : 0.0f;
  for (int i = 0; i < k; i++) {
    double w = idx[i] >= 0 ? sig[idx[i]] : 0.0;
    if (c->norm_topk_prob) w /= sum + 1e-20;
    wt[i] = (float)(w * c->routed_scaling_factor);
  }
  free(allowed);
  free(sig);
  free(choice);
}

void mlp_forward(const mlp_weights *w, float limit, const float *y, int T, float *out) {
  const int I = w->gate.rows;
  float *g = xmalloc((size_t)T * I * sizeof(float)), *u = xmalloc((size_t)T * I * sizeof(float));
  wmat_matmul(&w->gate, y, T, g);
  wmat_matmul(&w->up, y, T, u);
  for (size_t i = 0; i < (size_t)T * I; i++) g[i] = swiglu_clamped(g[i], u[i], limit);
  wmat_matmul(&w->down, g, T, out);
  free(g);
  free(u);
}

void moe_forward(const moe_weights *w, const glm53_config *c, const float *y, int T, float *out) {
  const int D = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
  float *logits = xmalloc((size_t)T * E * sizeof(float));
  int *idx = xmalloc((size_t)T * k * sizeof(int));
  float *wt = xmalloc((size_t)T * k * sizeof(float));
  wmat_matmul(&w->router, y, T, logits);
  for (int t = 0; t < T; t++) moe_route(c, logits + (size_t)t * E, w->bias, idx + (size_t)t * k, wt + (size_t)t * k);
  /* shared expert first, then each routed expert over the tokens routed to it
   * (ascending expert id, as the reference accumulates) */
  mlp_forward(&w->shared, c->swiglu_limit, y, T, out);
  int *rows = xmalloc((size_t)T * sizeof(int));
  float *rw = xmalloc((size_t)T * sizeof(float));
  float *xin = xmalloc((size_t)T * D * sizeof(float)), *xo = xmalloc((size_t)T * D * sizeof(float));
  for (int e = 0; e < E; e++) {
    int n = 0;
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++)
        if (idx[t * k + j] == e) {
          rows[n] = t;
          rw[n] = wt[t * k + j];
          memcpy(xin + (size_t)n * D, y + (size_t)t * D, D * sizeof(float));
          n++;
        }
    if (!n) continue;
    mlp_forward(&w->experts[e], c->swiglu_limit, xin, n, xo);
    for (int i = 0; i < n; i++)
      for (int d = 0; d < D; d++) out[(size_t)rows[i] * D + d] += rw[i] * xo[(size_t)i * D + d];
  }
  free(rows); free(rw); free(xin); free(xo); free(logits); free(idx); free(wt);
}
