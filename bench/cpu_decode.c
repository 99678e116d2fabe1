/* CPU decode benchmark on a synthetic model with full GLM-5.3-Flash layer
 * dimensions (hidden 4096, 64 MLA heads, q_lora 1536, kv_lora 512, nope/v
 * 256, KDA 64x128, indexer 32x128, experts 2048 wide, dense 12288, hc 4),
 * scaled down to 4 layers (KDA, KDA, KDA, MLA), all MoE with 32 routed
 * experts (top-8) + 1 shared, vocab 154880; Int4 g32 (f16 scales) for all
 * attention/expert matrices, Int8 g32 embed/lm_head, fp32 router, mHC,
 * norms, indexer head weights - the converter's default layout.
 *
 * Measures in the same run: this machine's read bandwidth (all threads,
 * median of 7), decode tok/s (median of N tokens), bytes of weights touched
 * per token, achieved GB/s and its ratio to the measured bandwidth; then a
 * split of the decode time into matrix products vs everything else.
 * usage: cpu_decode [n_tokens=16] [ctx_prefill=64] [max_batch=0]
 * max_batch > 0 adds batched decode: glm53_forward_batch of 1, 2, 4, ..
 * max_batch sessions (each prefilled with 8 tokens; median of 5 steps), as
 * the default loop and with GLM53_CPU_BATCH=1 (one batched forward):
 * ms/step, aggregate tok/s, speed-up over one session and over the loop.
 * BENCH_KVB_F32=1 stores MLA kv_b as fp32 (shows the cost of mla.c
 * dequantizing the whole kv_b on every call; docs/benchmarks.md). */
#include "model/layers.h"
#include "model/ops.h"
#include "model/session.h"
#include "cpu/qmatmul.h"
#include "model/backend.h"
#include "core/util.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_next(uint64_t *s) { *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27; return *s * 2685821657736338717ull; }

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
#pragma omp parallel
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t a = n / nt * t, b = t == nt - 1 ? n : n / nt * (t + 1);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)t * 77 + 1;
    for (size_t i = a; i < b; i += 8) {
      uint64_t v = rng_next(&s);
      memcpy(p + i, &v, b - i < 8 ? b - i : 8);
    }
  }
}

static size_t touched;  /* bytes of weights one decode token reads (filled as we build) */
static uint64_t seed = 1;

static void qmat(wmat *w, int fmt, int rows, int cols) {
  size_t n = (size_t)rows * cols, vb = fmt == WMAT_Q4 ? n / 2 : n, ng = n / 32;
  uint8_t *d = NULL;
  if (posix_memalign((void **)&d, 64, vb + 64 + ng * 2)) abort(); /* not zeroed: filled below */
  fill_bytes(d, vb, seed++);
  uint16_t *s = (uint16_t *)(d + ((vb + 63) & ~(size_t)63));
  /* scales so that rows have ~unit gain: sd of (n-8)*d ~ 4.6 d */
  float sd = (float)(1.0 / sqrt((double)cols) / (fmt == WMAT_Q4 ? 4.6 : 73.0));
  uint16_t h = f32_to_f16(sd);
  for (size_t i = 0; i < ng; i++) s[i] = h;
  if (fmt == WMAT_Q8) for (size_t i = 0; i < vb; i++) if (d[i] == 0x80) d[i] = 0;
  *w = (wmat){.fmt = fmt, .rows = rows, .cols = cols, .group = 32, .data = d, .scales = s, .owned = d};
}
static void fmat(wmat *w, int rows, int cols) {
  size_t n = (size_t)rows * cols;
  float *d = aligned_alloc64(n * 4);
  uint64_t s = seed++;
  for (size_t i = 0; i < n; i++) d[i] = (float)(((rng_next(&s) >> 40) / 16777216.0 - 0.5) * 3.4 / sqrt((double)cols));
  *w = (wmat){.fmt = WMAT_F32, .rows = rows, .cols = cols, .data = d, .owned = d};
}
static float *fvec(size_t n, float mean, float sd) {
  float *v = aligned_alloc64(n * 4);
  uint64_t s = seed++;
  for (size_t i = 0; i < n; i++) v[i] = mean + sd * (float)((rng_next(&s) >> 40) / 16777216.0 - 0.5);
  return v;
}
static void q4(wmat *w, int r, int c) { qmat(w, WMAT_Q4, r, c); touched += wmat_bytes(w); }
static void f32m(wmat *w, int r, int c) { fmat(w, r, c); touched += wmat_bytes(w); }
static float *vec(size_t n, float mean, float sd) { touched += n * 4; return fvec(n, mean, sd); }

static void config(glm53_config *c) {
  memset(c, 0, sizeof *c);
  c->vocab_size = 154880; c->hidden_size = 4096; c->intermediate_size = 12288; c->moe_intermediate_size = 2048;
  c->num_hidden_layers = 4; c->rms_norm_eps = 1e-5f;
  c->num_attention_heads = 64; c->num_key_value_heads = 64; c->q_lora_rank = 1536; c->kv_lora_rank = 512;
  c->qk_nope_head_dim = 256; c->v_head_dim = 256;
  c->index_n_heads = 32; c->index_head_dim = 128; c->index_topk = 2048; c->index_kpool = 4; c->index_kpool_always_select_tail = 1;
  c->linear_num_heads = 64; c->linear_head_dim = 128; c->linear_conv_kernel_dim = 4; c->linear_lower_bound = -5.0f;
  c->hc_mult = 4; c->hc_sinkhorn_iters = 20; c->hc_eps = 1e-6f;
  c->n_routed_experts = 32; c->num_experts_per_tok = 8; c->n_shared_experts = 1; c->n_group = 1; c->topk_group = 1;
  c->norm_topk_prob = 1; c->routed_scaling_factor = 2.5f; c->swiglu_limit = NAN;
  c->pad_token_id = -1; c->bos_token_id = -1;
  for (int l = 0; l < 4; l++) { c->layer_types[l] = l == 3 ? ATTN_MLA : ATTN_KDA; c->mlp_layer_types[l] = MLP_MOE; c->indexer_types[l] = INDEX_FULL; }
}

static glm53_model *build(size_t *expert_bytes) {
  glm53_model *m = xcalloc(1, sizeof *m);
  config(&m->cfg);
  const glm53_config *c = &m->cfg;
  int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, I = c->moe_intermediate_size;
  m->dir = xstrdup("(synthetic)");
  m->backend = glm53_cpu_backend();
  qmat(&m->embed, WMAT_Q8, c->vocab_size, D);       /* one row per token: not counted */
  qmat(&m->lm_head, WMAT_Q8, c->vocab_size, D);
  touched += wmat_bytes(&m->lm_head);
  m->final_norm = vec(D, 1, 0.1f);
  m->layers = xcalloc(4, sizeof(layer_weights));
  for (int l = 0; l < 4; l++) {
    layer_weights *L = &m->layers[l];
    L->attn_kind = c->layer_types[l]; L->mlp_kind = MLP_MOE; L->index_kind = INDEX_FULL;
    L->input_norm = vec(D, 1, 0.1f); L->post_attn_norm = vec(D, 1, 0.1f);
    mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    for (int i = 0; i < 2; i++) { hs[i]->fn = vec((size_t)mix * hc * D, 0, 0.01f); hs[i]->base = vec(mix, 0, 0.5f); hs[i]->scale = vec(3, 1, 0.2f); }
    if (L->attn_kind == ATTN_KDA) {
      kda_weights *k = &L->kda;
      int H = c->linear_num_heads, hd = c->linear_head_dim, inner = H * hd;
      q4(&k->q_proj, inner, D); q4(&k->k_proj, inner, D); q4(&k->v_proj, inner, D);
      k->conv = vec((size_t)3 * inner * c->linear_conv_kernel_dim, 0, 0.5f);
      q4(&k->f_a, hd, D); q4(&k->f_b, inner, hd); k->dt_bias = vec(inner, 0, 0.5f); k->A_log = vec(H, 0, 0.5f);
      q4(&k->b_proj, H, D); q4(&k->g_a, hd, D); q4(&k->g_b, inner, hd); k->o_norm = vec(hd, 1, 0.1f);
      q4(&k->o_proj, D, inner);
    } else {
      mla_weights *a = &L->mla;
      int H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim, ql = c->q_lora_rank, kl = c->kv_lora_rank;
      q4(&a->q_a, ql, D); a->q_a_norm = vec(ql, 1, 0.1f); q4(&a->q_b, H * nope, ql); q4(&a->kv_a, kl, D);
      a->kv_a_norm = vec(kl, 1, 0.1f); if (getenv("BENCH_KVB_F32")) f32m(&a->kv_b, H * (nope + vd), kl); else q4(&a->kv_b, H * (nope + vd), kl); q4(&a->o_proj, D, H * vd);
      a->has_indexer = 1;
      indexer_weights *x = &a->idx;
      q4(&x->wq_b, c->index_n_heads * c->index_head_dim, ql); q4(&x->wk, c->index_head_dim, D);
      x->k_norm_w = vec(c->index_head_dim, 1, 0.1f); x->k_norm_b = vec(c->index_head_dim, 0, 0.1f);
      f32m(&x->weights_proj, c->index_n_heads, D); q4(&x->gate, c->index_head_dim, D);
      x->ape = vec((size_t)c->index_kpool * c->index_head_dim, 0, 0.5f);
    }
    moe_weights *e = &L->moe;
    f32m(&e->router, c->n_routed_experts, D);
    e->bias = vec(c->n_routed_experts, 0, 0.01f);
    q4(&e->shared.gate, I, D); q4(&e->shared.up, I, D); q4(&e->shared.down, D, I);
    e->experts = xcalloc((size_t)c->n_routed_experts, sizeof(mlp_weights));
    for (int i = 0; i < c->n_routed_experts; i++) {
      qmat(&e->experts[i].gate, WMAT_Q4, I, D); qmat(&e->experts[i].up, WMAT_Q4, I, D); qmat(&e->experts[i].down, WMAT_Q4, D, I);
    }
    *expert_bytes = 3 * wmat_bytes(&e->experts[0].gate);
    touched += (size_t)c->num_experts_per_tok * *expert_bytes;
  }
  return m;
}

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmpd); return v[n / 2]; }

/* read bandwidth: every thread sums its share of a buffer far larger than
 * the caches, 8 independent 64-byte accumulators so the loop is load-bound */
typedef uint64_t v8u __attribute__((vector_size(64)));
__attribute__((target_clones("avx512f", "avx2", "default"))) static uint64_t sum_range(const v8u *buf, size_t a, size_t b) {
  v8u s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  size_t i = a;
  for (; i + 4 <= b; i += 4) { s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3]; }
  for (; i < b; i++) s0 += buf[i];
  s0 += s1 + s2 + s3;
  uint64_t x = 0;
  for (int j = 0; j < 8; j++) x += s0[j];
  return x;
}
static double bandwidth(size_t bytes) {
  v8u *buf = aligned_alloc64(bytes);
  fill_bytes((uint8_t *)buf, bytes, 7);
  size_t n = bytes / sizeof(v8u);
  double t[9];
  volatile uint64_t sink = 0;
  for (int k = 0; k < 9; k++) {
    double t0 = now_sec();
#pragma omp parallel
    {
      int th = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t a = n / nt * th, b = th == nt - 1 ? n : n / nt * (th + 1);
      uint64_t x = sum_range(buf, a, b);
#pragma omp atomic
      sink += x;
    }
    t[k] = bytes / (now_sec() - t0) / 1e9;
  }
  (void)sink;
  free(buf);
  return median(t, 9);
}

/* every matrix a decode token multiplies (8 experts per MoE layer), once */
static double cat_t[4]; /* lm_head, attention, router+shared, routed experts */
static double matmul_only(const glm53_model *m) {
  static float x[16384 * 4], y[154880 + 64];
  for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = 0.01f * (float)(i % 17);
  double t0 = now_sec(), tc = t0;
  wmat_matvec(&m->lm_head, x, y);
  cat_t[0] += now_sec() - tc;
  for (int l = 0; l < 4; l++) {
    const layer_weights *L = &m->layers[l];
    const wmat *ws[16];
    int n = 0;
    if (L->attn_kind == ATTN_KDA) {
      const kda_weights *k = &L->kda;
      const wmat *a[] = {&k->q_proj, &k->k_proj, &k->v_proj, &k->f_a, &k->f_b, &k->b_proj, &k->g_a, &k->g_b, &k->o_proj};
      for (size_t i = 0; i < 9; i++) ws[n++] = a[i];
    } else {
      const mla_weights *a = &L->mla;
      const wmat *b[] = {&a->q_a, &a->q_b, &a->kv_a, &a->kv_b, &a->o_proj, &a->idx.wq_b, &a->idx.wk, &a->idx.weights_proj, &a->idx.gate};
      for (size_t i = 0; i < 9; i++) ws[n++] = b[i];
    }
    int na = n;
    ws[n++] = &L->moe.router;
    ws[n++] = &L->moe.shared.gate; ws[n++] = &L->moe.shared.up; ws[n++] = &L->moe.shared.down;
    for (int i = 0; i < n; i++) {
      tc = now_sec();
      wmat_matvec(ws[i], x, y);
      cat_t[i < na ? 1 : 2] += now_sec() - tc;
    }
    tc = now_sec();
    for (int e = 0; e < m->cfg.num_experts_per_tok; e++) {
      const mlp_weights *w = &L->moe.experts[e * 3 % m->cfg.n_routed_experts];
      wmat_matvec(&w->gate, x, y); wmat_matvec(&w->up, x, y); wmat_matvec(&w->down, x, y);
    }
    cat_t[3] += now_sec() - tc;
  }
  return now_sec() - t0;
}

/* One decode token through the layer pieces with timers (same calls as
 * forward.c): where the non-matmul time goes. prof: mHC, KDA, MLA, MoE, head. */
static void profile_token(glm53_session *s, int32_t tok, double *prof) {
  const glm53_model *m = s->m;
  const glm53_config *c = &m->cfg;
  const int D = c->hidden_size, hc = c->hc_mult;
  float *X = xmalloc((size_t)hc * D * 4), post[16], comb[256], *u = xmalloc((size_t)D * 4), *y = xmalloc((size_t)D * 4),
        *a = xmalloc((size_t)D * 4), *lg = xmalloc((size_t)c->vocab_size * 4);
  wmat_get_row(&m->embed, tok, X);
  for (int h = 1; h < hc; h++) memcpy(X + (size_t)h * D, X, (size_t)D * 4);
  dsa_sel sel;
  int pool_buf[2048];
  double t;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const layer_weights *L = &m->layers[l];
    for (int site = 0; site < 2; site++) {
      t = now_sec();
      mhc_pre(site ? &L->hc_ffn : &L->hc_attn, c, X, post, comb, u);
      rmsnorm(y, u, site ? L->post_attn_norm : L->input_norm, D, c->rms_norm_eps);
      prof[0] += now_sec() - t;
      t = now_sec();
      if (site) { moe_forward(&L->moe, c, y, 1, a); prof[3] += now_sec() - t; }
      else if (L->attn_kind == ATTN_KDA) { kda_forward(&L->kda, c, &s->kda[l], y, 1, a); prof[1] += now_sec() - t; }
      else { mla_forward(&L->mla, c, &s->mla[l], y, 1, s->pos, &sel, pool_buf, a); prof[2] += now_sec() - t; }
      t = now_sec();
      mhc_post(c, a, post, comb, X);
      prof[0] += now_sec() - t;
    }
  }
  t = now_sec();
  wmat_matvec(&m->lm_head, X, lg);
  prof[4] += now_sec() - t;
  free(X); free(u); free(y); free(a); free(lg);
}

int main(int argc, char **argv) {
  int ntok = argc > 1 ? atoi(argv[1]) : 16, pre = argc > 2 ? atoi(argv[2]) : 64;
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("threads %d, ISA %s\n", omp_get_max_threads(), cpu_isa_name(cpu_isa()));
  double bw = bandwidth((size_t)2 << 30);
  printf("measured read bandwidth: %.2f GB/s (median of 9, 2 GiB buffer)\n", bw);
  size_t eb;
  double t0 = now_sec();
  glm53_model *m = build(&eb);
  printf("built synthetic model in %.1f s: 4 layers (KDA,KDA,KDA,MLA), 32 experts top-8, vocab %d; one expert %.1f MB\n",
         now_sec() - t0, m->cfg.vocab_size, eb / 1e6);
  printf("weights touched per decode token: %.1f MB (Int4 g32 matrices, Int8 lm_head, fp32 router/mHC/norms)\n", touched / 1e6);
  glm53_session *s = glm53_session_new(m, pre + ntok + 8);
  int32_t *tok = xmalloc((size_t)(pre + ntok + 8) * sizeof(int32_t));
  uint64_t r = 3;
  for (int i = 0; i < pre + ntok + 8; i++) tok[i] = (int32_t)(rng_next(&r) % (uint64_t)m->cfg.vocab_size);
  float *logits = xmalloc((size_t)m->cfg.vocab_size * sizeof(float));
  t0 = now_sec();
  if (glm53_forward(s, tok, pre, logits, 0)) { fprintf(stderr, "forward failed\n"); return 1; }
  double tp = now_sec() - t0;
  printf("prefill %d tokens: %.2f s (%.1f tok/s)\n", pre, tp, pre / tp);
  for (int i = 0; i < 2; i++) glm53_forward(s, tok + pre + i, 1, logits, 0); /* warm-up */
  double *dt = xmalloc((size_t)ntok * sizeof(double)), *mm = xmalloc((size_t)ntok * sizeof(double));
  for (int i = 0; i < ntok; i++) {
    t0 = now_sec();
    glm53_forward(s, tok + pre + 2 + i, 1, logits, 0);
    dt[i] = now_sec() - t0;
  }
  for (int i = 0; i < ntok; i++) mm[i] = matmul_only(m);
  double td = median(dt, ntok), tm = median(mm, ntok);
  double gbs = touched / td / 1e9, gbs_mm = touched / tm / 1e9;
  printf("decode: median %.1f ms/token = %.2f tok/s; %.2f GB/s of weights = %.0f%% of measured bandwidth\n", td * 1e3, 1 / td, gbs,
         100 * gbs / bw);
  printf("matmuls alone (same bytes): median %.1f ms = %.2f GB/s = %.0f%% of bandwidth; non-matmul work %.1f ms/token (%.0f%%)\n",
         tm * 1e3, gbs_mm, 100 * gbs_mm / bw, (td - tm) * 1e3, 100 * (td - tm) / td);
  printf("matmul split (ms/token): lm_head %.1f, attention %.1f, router+shared %.1f, routed experts %.1f\n", cat_t[0] * 1e3 / ntok,
         cat_t[1] * 1e3 / ntok, cat_t[2] * 1e3 / ntok, cat_t[3] * 1e3 / ntok);
  printf("RESULT bw_gbs=%.2f tok_s=%.3f gbs=%.2f ratio=%.3f mm_gbs=%.2f mm_ratio=%.3f nonmm_ms=%.1f\n", bw, 1 / td, gbs, gbs / bw, gbs_mm,
         gbs_mm / bw, (td - tm) * 1e3);
  double prof[5] = {0};
  for (int i = 0; i < ntok; i++) profile_token(s, tok[i], prof);
  printf("decode profile (ms/token, incl. their matmuls): mHC pre/post %.1f, KDA layers %.1f, MLA layer %.1f, MoE %.1f, lm_head %.1f\n",
         prof[0] * 1e3 / ntok, prof[1] * 1e3 / ntok, prof[2] * 1e3 / ntok, prof[3] * 1e3 / ntok, prof[4] * 1e3 / ntok);
  glm53_session_free(s);
  const int maxb = argc > 3 ? atoi(argv[3]) : 0;
  if (maxb > 0) {
    const int V = m->cfg.vocab_size, steps = 5, bpre = 8;
    glm53_session **bs = xcalloc((size_t)maxb, sizeof *bs);
    float *bl = xmalloc((size_t)maxb * V * sizeof(float));
    int32_t *bt = xmalloc((size_t)maxb * sizeof(int32_t));
    uint64_t bseed = 99;
    for (int i = 0; i < maxb; i++) {
      bs[i] = glm53_session_new(m, bpre + 2 * 8 * steps + 8);
      for (int t = 0; t < bpre; t++) bt[0] = (int32_t)(rng_next(&bseed) % V), glm53_forward(bs[i], bt, 1, NULL, 0);
    }
    double one = 0;
    for (int n = 1; n <= maxb; n *= 2) {
      double med[2];
      for (int mode = 0; mode < 2; mode++) { /* the default loop, then the batched forward */
        if (mode) setenv("GLM53_CPU_BATCH", "1", 1);
        else unsetenv("GLM53_CPU_BATCH");
        double st[5];
        for (int k = 0; k < steps; k++) {
          for (int i = 0; i < n; i++) bt[i] = (int32_t)(rng_next(&bseed) % V);
          double t0 = now_sec();
          if (glm53_forward_batch(bs, bt, n, bl)) { fprintf(stderr, "batch: %s\n", glm53_last_error()); return 1; }
          st[k] = now_sec() - t0;
        }
        qsort(st, steps, sizeof *st, cmpd);
        med[mode] = st[steps / 2];
      }
      if (n == 1) one = med[0];
      printf("batch %2d: loop %.1f ms/step, batched forward %.1f ms/step = %.2f tok/s (%.2fx one session, %.2fx the loop)\n", n,
             med[0] * 1e3, med[1] * 1e3, n / med[1], n * one / med[1], med[0] / med[1]);
    }
    unsetenv("GLM53_CPU_BATCH");
    for (int i = 0; i < maxb; i++) glm53_session_free(bs[i]);
    free(bs); free(bl); free(bt);
  }
  glm53_model_free(m);
  free(tok); free(logits); free(dt); free(mm);
  return 0;
}
