/* Kimi Delta Attention (KDA) linear-attention layers: short causal conv,
 * per-channel forget gate with lower bound, beta, L2-normalised q/k, delta
 * rule recurrence (token form for decode, chunked form for prefill, both on
 * one state), gated RMSNorm output. */
#include "model/layers.h"
#include "model/ops.h"
#include "core/util.h"
#include <stdlib.h>

void kda_step(float *S, const float *q, const float *k, const float *v, const float *g, float beta, int dk, int dv, float *o) {
  for (int i = 0; i < dk; i++) {
    float a = expf(g[i]);
    for (int j = 0; j < dv; j++) S[i * dv + j] *= a;
  }
  for (int j = 0; j < dv; j++) {
    double r = 0;
    for (int i = 0; i < dk; i++) r += (double)S[i * dv + j] * k[i];
    float delta = beta * (v[j] - (float)r);
    for (int i = 0; i < dk; i++) S[i * dv + j] += k[i] * delta;
  }
  for (int j = 0; j < dv; j++) {
    double acc = 0;
    for (int i = 0; i < dk; i++) acc += (double)S[i * dv + j] * q[i];
    o[j] = (float)acc;
  }
}

/* One chunk of C <= chunk tokens (see docs/architecture.md, "KDA chunked
 * form"): U = (I+M)^-1 (beta V), W = (I+M)^-1 (beta K exp(G)), V' = U - W S,
 * O = (q exp(G)) S + tril(q k^T decay) V', S' = exp(G_last) S + (k exp(G_last-G))^T V'.
 * Every exponent is a difference G_r - G_s with s <= r, so nothing overflows. */
static void kda_one_chunk(float *S, int C, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int dk, int dv, float *o, float *ws) {
  float *G = ws;                 /* [C][dk] cumulative log decay */
  float *M = G + C * dk;         /* [C][C] */
  float *U = M + C * C;          /* [C][dv] */
  float *W = U + C * dv;         /* [C][dk] */
  for (int r = 0; r < C; r++)
    for (int i = 0; i < dk; i++) G[r * dk + i] = g[r * dk + i] + (r ? G[(r - 1) * dk + i] : 0.0f);
  for (int r = 0; r < C; r++)
    for (int s = 0; s < r; s++) {
      double acc = 0;
      for (int i = 0; i < dk; i++) acc += (double)k[r * dk + i] * k[s * dk + i] * exp((double)G[r * dk + i] - G[s * dk + i]);
      M[r * C + s] = (float)(beta[r] * acc);
    }
  /* forward substitution: (I + M) U = beta V, (I + M) W = beta K exp(G) */
  for (int r = 0; r < C; r++) {
    for (int j = 0; j < dv; j++) {
      double acc = (double)beta[r] * v[r * dv + j];
      for (int s = 0; s < r; s++) acc -= (double)M[r * C + s] * U[s * dv + j];
      U[r * dv + j] = (float)acc;
    }
    for (int i = 0; i < dk; i++) {
      double acc = (double)beta[r] * k[r * dk + i] * exp((double)G[r * dk + i]);
      for (int s = 0; s < r; s++) acc -= (double)M[r * C + s] * W[s * dk + i];
      W[r * dk + i] = (float)acc;
    }
  }
  /* V' = U - W S (stored over U) */
  for (int r = 0; r < C; r++)
    for (int j = 0; j < dv; j++) {
      double acc = 0;
      for (int i = 0; i < dk; i++) acc += (double)W[r * dk + i] * S[i * dv + j];
      U[r * dv + j] -= (float)acc;
    }
  for (int r = 0; r < C; r++) {
    for (int j = 0; j < dv; j++) {
      double acc = 0;
      for (int i = 0; i < dk; i++) acc += (double)q[r * dk + i] * exp((double)G[r * dk + i]) * S[i * dv + j];
      o[r * dv + j] = (float)acc;
    }
    for (int s = 0; s <= r; s++) {
      double a = 0;
      for (int i = 0; i < dk; i++) a += (double)q[r * dk + i] * k[s * dk + i] * exp((double)G[r * dk + i] - G[s * dk + i]);
      for (int j = 0; j < dv; j++) o[r * dv + j] += (float)(a * U[s * dv + j]);
    }
  }
  const float *Gl = G + (C - 1) * dk;
  for (int i = 0; i < dk; i++) {
    float a = expf(Gl[i]);
    for (int j = 0; j < dv; j++) {
      double acc = (double)a * S[i * dv + j];
      for (int s = 0; s < C; s++) acc += (double)k[s * dk + i] * exp((double)Gl[i] - G[s * dk + i]) * U[s * dv + j];
      S[i * dv + j] = (float)acc;
    }
  }
}

void kda_chunked(float *S, int T, int chunk, const float *q, const float *k, const float *v, const float *g,
                 const float *beta, int dk, int dv, float *o) {
  float *ws = xmalloc(((size_t)chunk * dk * 2 + (size_t)chunk * chunk + (size_t)chunk * dv) * sizeof(float));
  for (int t0 = 0; t0 < T; t0 += chunk) {
    int C = T - t0 < chunk ? T - t0 : chunk;
    kda_one_chunk(S, C, q + (size_t)t0 * dk, k + (size_t)t0 * dk, v + (size_t)t0 * dv, g + (size_t)t0 * dk, beta + t0,
                  dk, dv, o + (size_t)t0 * dv, ws);
  }
  free(ws);
}

/* Prefill form. The reference defaults to the token recurrence for prefill
 * too: then every token's arithmetic is the same however the prompt is split,
 * so prefill, decode and chunked prefill agree bit for bit (no near-tie flips
 * of router or indexer decisions between them). GLM53_KDA_PREFILL=chunked
 * selects the chunked form (same math, different rounding; see test_kda). */
int kda_prefill_chunked(void) {
  static int mode = -1;
  if (mode < 0) {
    const char *e = getenv("GLM53_KDA_PREFILL");
    mode = e && !strcmp(e, "chunked");
  }
  return mode;
}

void kda_forward(const kda_weights *w, const glm53_config *c, kda_state *st, const float *y, int T, float *out) {
  const seq_run run = {.t0 = 0, .len = T, .pos0 = 0, .kda = st};
  kda_forward_runs(w, c, &run, 1, y, T, out);
}

void kda_forward_runs(const kda_weights *w, const glm53_config *c, const seq_run *runs, int nruns, const float *y, int T,
                      float *out) {
  const int H = c->linear_num_heads, hd = c->linear_head_dim, inner = H * hd;
  const int K = c->linear_conv_kernel_dim, ch = 3 * inner;
  float *raw = xmalloc((size_t)T * ch * sizeof(float));   /* [T][q|k|v] pre-conv */
  float *tmp = xmalloc((size_t)T * inner * sizeof(float));
  for (int p = 0; p < 3; p++) {
    const wmat *pw = p == 0 ? &w->q_proj : p == 1 ? &w->k_proj : &w->v_proj;
    wmat_matmul(pw, y, T, tmp);
    for (int t = 0; t < T; t++) memcpy(raw + (size_t)t * ch + (size_t)p * inner, tmp + (size_t)t * inner, inner * sizeof(float));
  }
  /* Causal depthwise conv over [state | raw] of each run, then SiLU. Tap K-1
   * is the current token. */
  float *qkv = xmalloc((size_t)T * ch * sizeof(float));
#pragma omp parallel for schedule(static)
  for (int j = 0; j < ch; j++) {
    const float *wj = w->conv + (size_t)j * K;
    for (int r = 0; r < nruns; r++) {
      const float *rraw = raw + (size_t)runs[r].t0 * ch, *conv = runs[r].kda->conv;
      for (int t = 0; t < runs[r].len; t++) {
        double acc = 0;
        for (int tau = 0; tau < K; tau++) {
          int src = t - (K - 1) + tau; /* index into the run's raw; negative = conv state */
          float x = src >= 0 ? rraw[(size_t)src * ch + j] : conv[(size_t)(K - 1 + src) * ch + j];
          acc += (double)wj[tau] * x;
        }
        qkv[(size_t)(runs[r].t0 + t) * ch + j] = siluf_((float)acc);
      }
    }
  }
  /* new conv state = last K-1 inputs of [state | raw], per run */
  float *ns = xmalloc((size_t)(K - 1) * ch * sizeof(float));
  for (int r = 0; r < nruns; r++) {
    const float *rraw = raw + (size_t)runs[r].t0 * ch;
    float *conv = runs[r].kda->conv;
    for (int s = 0; s < K - 1; s++) {
      int src = runs[r].len - (K - 1) + s;
      const float *from = src >= 0 ? rraw + (size_t)src * ch : conv + (size_t)(K - 1 + src) * ch;
      memcpy(ns + (size_t)s * ch, from, ch * sizeof(float));
    }
    memcpy(conv, ns, (size_t)(K - 1) * ch * sizeof(float));
  }
  free(ns);
  /* gates from y: g = lb * sigmoid(exp(A_log) (f + dt_bias)); beta = sigmoid(b) */
  float *fa = xmalloc((size_t)T * hd * sizeof(float));
  float *g = xmalloc((size_t)T * inner * sizeof(float));
  wmat_matmul(&w->f_a, y, T, fa);
  wmat_matmul(&w->f_b, fa, T, g);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      float rate = expf(w->A_log[h]);
      for (int i = 0; i < hd; i++) {
        float *gi = &g[(size_t)t * inner + h * hd + i];
        float x = *gi + w->dt_bias[h * hd + i];
        *gi = c->linear_lower_bound * sigmoidf_(rate * x); /* a scale, not a clamp; a null bound is rejected at load */
      }
    }
  float *beta = xmalloc((size_t)T * H * sizeof(float));
  wmat_matmul(&w->b_proj, y, T, beta);
  for (int i = 0; i < T * H; i++) beta[i] = sigmoidf_(beta[i]);
  /* z = output gate logits */
  float *z = xmalloc((size_t)T * inner * sizeof(float));
  wmat_matmul(&w->g_a, y, T, fa);
  wmat_matmul(&w->g_b, fa, T, z);

  const float qscale = 1.0f / sqrtf((float)hd);
  float *o = tmp; /* [T][inner] */
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < H; h++) {
    float *qh = xmalloc((size_t)T * hd * sizeof(float)), *kh = xmalloc((size_t)T * hd * sizeof(float));
    float *vh = xmalloc((size_t)T * hd * sizeof(float)), *gh = xmalloc((size_t)T * hd * sizeof(float));
    float *bh = xmalloc((size_t)T * sizeof(float)), *oh = xmalloc((size_t)T * hd * sizeof(float));
    for (int t = 0; t < T; t++) {
      const float *row = qkv + (size_t)t * ch;
      memcpy(qh + (size_t)t * hd, row + h * hd, hd * sizeof(float));
      memcpy(kh + (size_t)t * hd, row + inner + h * hd, hd * sizeof(float));
      memcpy(vh + (size_t)t * hd, row + 2 * inner + h * hd, hd * sizeof(float));
      memcpy(gh + (size_t)t * hd, g + (size_t)t * inner + h * hd, hd * sizeof(float));
      bh[t] = beta[t * H + h];
      l2norm(qh + (size_t)t * hd, hd, 1e-6f);
      l2norm(kh + (size_t)t * hd, hd, 1e-6f);
      for (int i = 0; i < hd; i++) qh[(size_t)t * hd + i] *= qscale;
    }
    for (int r = 0; r < nruns; r++) { /* each run through its own state */
      float *S = runs[r].kda->S + (size_t)h * hd * hd;
      const int L = runs[r].len;
      const size_t o0 = (size_t)runs[r].t0 * hd;
      if (L > 1 && kda_prefill_chunked())
        kda_chunked(S, L, 64, qh + o0, kh + o0, vh + o0, gh + o0, bh + runs[r].t0, hd, hd, oh + o0);
      else
        for (int t = runs[r].t0; t < runs[r].t0 + L; t++)
          kda_step(S, qh + (size_t)t * hd, kh + (size_t)t * hd, vh + (size_t)t * hd, gh + (size_t)t * hd, bh[t], hd, hd,
                   oh + (size_t)t * hd);
    }
    /* gated RMSNorm per head: w * o / rms(o) * sigmoid(z) */
    for (int t = 0; t < T; t++) {
      float *ot = oh + (size_t)t * hd;
      rmsnorm(ot, ot, w->o_norm, hd, c->rms_norm_eps);
      for (int i = 0; i < hd; i++) o[(size_t)t * inner + h * hd + i] = ot[i] * sigmoidf_(z[(size_t)t * inner + h * hd + i]);
    }
    free(qh); free(kh); free(vh); free(gh); free(bh); free(oh);
  }
  wmat_matmul(&w->o_proj, o, T, out);
  free(raw); free(tmp); free(qkv); free(fa); free(g); free(beta); free(z);
}
