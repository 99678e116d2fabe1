/* The fp32 reference implementation of each part of a GLM-5.3 layer. Each
 * function is written for clarity; tests compare them with float64 versions. */
#ifndef GLM53_MODEL_LAYERS_H
#define GLM53_MODEL_LAYERS_H
#include "model/model.h"
#include "model/session.h"

/* ---- mHC (mhc.c) ---- */
/* X: [hc][D] streams of one token. Outputs post[hc], comb[hc][hc] (row g =
 * source stream, column h = destination), u[D] = sum_s pre[s] X[s]. */
void mhc_pre(const mhc_weights *w, const glm53_config *c, const float *X, float *post, float *comb, float *u);
/* X'[h] = post[h] y + sum_g comb[g][h] X[g], in place on X. */
void mhc_post(const glm53_config *c, const float *y, const float *post, const float *comb, float *X);
/* Sinkhorn projection exactly as the reference: row softmax + eps, column
 * normalisation, then (iters-1) x (row, column). In place on L[n][n]. */
void mhc_sinkhorn(float *L, int n, int iters, float eps);

/* ---- KDA (kda.c) ---- */
/* One head, one token: decays S[dk][dv] by exp(g), delta-rule update with
 * beta, writes o[dv] = S^T q. q must already be l2-normalised and scaled. */
void kda_step(float *S, const float *q, const float *k, const float *v, const float *g, float beta, int dk, int dv, float *o);
/* One head, T tokens in chunks of `chunk` (exact chunked form of kda_step;
 * q,k,g: [T][dk], v,o: [T][dv], beta: [T]). */
void kda_chunked(float *S, int T, int chunk, const float *q, const float *k, const float *v, const float *g,
                 const float *beta, int dk, int dv, float *o);
/* 1 if prefill uses kda_chunked (GLM53_KDA_PREFILL=chunked), else the recurrence. */
int kda_prefill_chunked(void);
/* A run of tokens of one sequence inside a call that may carry several
 * sequences (batched decode): tokens [t0, t0 + len) of the call are that
 * sequence's positions pos0.., with its KDA / MLA state of the layer. The
 * weight products run once over all the call's tokens; the state parts
 * (conv, recurrence, caches, selection, attention) per run. A token's
 * result does not depend on the other runs. */
typedef struct {
  int t0, len, pos0;
  kda_state *kda;
  mla_state *mla;
} seq_run;

/* Whole KDA attention for T tokens of normed input y[T][D] -> out[T][D];
 * advances st. */
void kda_forward(const kda_weights *w, const glm53_config *c, kda_state *st, const float *y, int T, float *out);
/* The same over runs of several sequences (their lengths sum to T). */
void kda_forward_runs(const kda_weights *w, const glm53_config *c, const seq_run *runs, int nruns, const float *y, int T,
                      float *out);

/* ---- DSA indexer + MLA (mla.c) ---- */
/* Selection for one query: all tokens <= t (dense), or the listed pools
 * (expanded to kpool tokens each) plus the tail tokens [tail_begin, t]. */
typedef struct {
  int dense;
  int npools;
  int *pools;      /* npools pool indices (points into caller storage) */
  int tail_begin;  /* first tail token; tail is [tail_begin, t] (empty if > t) */
} dsa_sel;

/* Top-k over pools: chooses k of n scores by (score desc, index asc), NaN as
 * -inf; writes indices in that order. */
void topk_pools(const float *score, int n, int k, int *out);
/* Indexer scores of pools [0, npool) for one query: sum_h w[h] relu(q_h.K_p * s). */
void indexer_scores(const glm53_config *c, const float *q, const float *w, const float *pool, int npool, float *score);
/* MLA attention for T tokens at positions pos0.. of normed input y.
 * full: this layer runs its own indexer and writes sel[T] (pool storage
 * [T][index_topk/kpool] in pool_buf); otherwise sel is read (shared layer). */
void mla_forward(const mla_weights *w, const glm53_config *c, mla_state *st, const float *y, int T, int pos0,
                 dsa_sel *sel, int *pool_buf, float *out);
/* The same over runs of several sequences (seq_run above; sel and pool_buf
 * are per token of the call). */
void mla_forward_runs(const mla_weights *w, const glm53_config *c, const seq_run *runs, int nruns, const float *y, int T,
                      dsa_sel *sel, int *pool_buf, float *out);

/* ---- MLP / MoE (moe.c) ---- */
/* Router for one token: expert ids idx[k] and weights wt[k] (k = experts per
 * token), from fp32 logits[E]. Deterministic: ties by lower index. */
void moe_route(const glm53_config *c, const float *logits, const float *bias, int *idx, float *wt);
void mlp_forward(const mlp_weights *w, float limit, const float *y, int T, float *out);
void moe_forward(const moe_weights *w, const glm53_config *c, const float *y, int T, float *out);

#endif
