/* GPU speed on a synthetic model with GLM-5.3-Flash's real dimensions
 * (hidden 4096, 64 MLA heads with kv_lora 512 / q_lora 1536 / nope 256 /
 * v 256, KDA 64 heads x 128, indexer 32 x 128 with kpool 4 / topk 2048,
 * experts 2048 wide top-8, dense MLP 12288, vocab 154880, hc 4) scaled down
 * to 6 layers (KDA, MLA+indexer, KDA, MLA shared indexer, KDA, KDA; layer 0
 * dense MLP, the others MoE) and 32 routed experts, bf16 weights.
 * Prints: measured D2D copy bandwidth and bf16 cuBLAS GEMM rate (ceilings),
 * batch-1 decode tok/s at short and 4K context with achieved weight
 * bandwidth, prefill tok/s at 4096 tokens with achieved TFLOP/s.
 * Modes (third argument):
 *  bf16 (default) as above;
 *  q4: every matrix in Q4 (group 32, bf16 scales; the GEMV shapes in Q4 too)
 *      so that more experts fit (e.g. 128): decode at short context;
 *  stream: the bf16 model at several routed-expert VRAM budgets (all
 *      resident .. nothing resident, cache slots 1/4 of the budget or 2 x
 *      top-k): decode tok/s against the cache hit rate and the bytes copied,
 *      next to the pinned host->device bandwidth measured in the same run.
 * Usage: gpu_decode [experts=32] [decode_steps=32] [bf16|q4|stream] */
#include "glm53.h"
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "model/model.h"
#include "model/backend.h"
#include "core/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}
static uint64_t g_seed = 1;
static int g_q4; /* synthesise Q4 matrices */
/* Q4 (docs/format.md fmt=4): random nibbles, bf16 group scales giving the
 * same standard deviation as bmat */
static void qmat(wmat *w, int rows, int cols) {
  size_t n = (size_t)rows * cols, ng = n / 32;
  uint8_t *d = xmalloc(n / 2 + ng * 2);
  uint16_t *sc = (uint16_t *)(d + n / 2);
  uint64_t seed = mix64(++g_seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n / 16; i++) {
    uint64_t h = mix64(seed + i);
    memcpy(d + i * 8, &h, 8);
  }
  const float s = sqrtf(1.0f / cols) / 4.61f; /* nibble - 8 has sd ~4.61 */
  for (size_t g = 0; g < ng; g++) sc[g] = f32_to_bf16(s * (0.75f + 0.5f * (float)(mix64(seed ^ (g + 0x9e37)) >> 40) / 16777216.0f));
  w->fmt = WMAT_Q4; w->rows = rows; w->cols = cols; w->group = 32; w->scale_bf16 = 1;
  w->data = d; w->scales = sc; w->owned = d;
}
/* uniform with the given standard deviation, as bf16 */
static void bmat(wmat *w, int rows, int cols) {
  if (g_q4 && cols % 32 == 0) { qmat(w, rows, cols); return; }
  size_t n = (size_t)rows * cols;
  uint16_t *d = xmalloc(n * 2);
  float a = sqrtf(3.0f / cols);
  uint64_t seed = mix64(++g_seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    uint64_t h = mix64(seed + i);
    d[i] = f32_to_bf16(a * (float)((double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0));
  }
  w->fmt = WMAT_BF16; w->rows = rows; w->cols = cols; w->data = d; w->owned = d;
}
static float *fvec(size_t n, float mean, float amp) {
  float *v = xmalloc(n * sizeof(float));
  uint64_t seed = mix64(++g_seed);
  for (size_t i = 0; i < n; i++) v[i] = mean + amp * (float)((double)(mix64(seed + i) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  return v;
}
static void bmlp(mlp_weights *m, int D, int I) { bmat(&m->gate, I, D); bmat(&m->up, I, D); bmat(&m->down, D, I); }

static glm53_model *synth(int E, size_t *decode_bytes, double *active_params) {
  glm53_model *m = xcalloc(1, sizeof *m);
  glm53_config *c = &m->cfg;
  c->vocab_size = 154880; c->hidden_size = 4096; c->intermediate_size = 12288; c->moe_intermediate_size = 2048;
  c->num_hidden_layers = 6; c->rms_norm_eps = 1e-5f;
  c->num_attention_heads = 64; c->num_key_value_heads = 64; c->q_lora_rank = 1536; c->kv_lora_rank = 512;
  c->qk_nope_head_dim = 256; c->qk_rope_head_dim = 0; c->v_head_dim = 256;
  c->index_n_heads = 32; c->index_head_dim = 128; c->index_topk = 2048; c->index_kpool = 4;
  c->index_kpool_always_select_tail = 1;
  c->linear_num_heads = 64; c->linear_head_dim = 128; c->linear_conv_kernel_dim = 4; c->linear_lower_bound = -5.0f;
  c->hc_mult = 4; c->hc_sinkhorn_iters = 20; c->hc_eps = 1e-6f;
  c->n_routed_experts = E; c->num_experts_per_tok = 8; c->n_shared_experts = 1; c->n_group = 1; c->topk_group = 1;
  c->norm_topk_prob = 1; c->routed_scaling_factor = 2.5f; c->swiglu_limit = 10.0f;
  static const int kinds[6] = {ATTN_KDA, ATTN_MLA, ATTN_KDA, ATTN_MLA, ATTN_KDA, ATTN_KDA};
  const int D = 4096, hc = 4, mix = (2 + hc) * hc;
  m->dir = xstrdup("(synthetic full-dimension model)");
  m->backend = glm53_cpu_backend();
  bmat(&m->embed, c->vocab_size, D);
  bmat(&m->lm_head, c->vocab_size, D);
  m->final_norm = fvec(D, 1, 0.1f);
  m->layers = xcalloc(6, sizeof(layer_weights));
  size_t bytes = wmat_bytes(&m->lm_head), expert = 0;
  for (int l = 0; l < 6; l++) {
    layer_weights *L = &m->layers[l];
    c->layer_types[l] = kinds[l];
    c->mlp_layer_types[l] = l == 0 ? MLP_DENSE : MLP_MOE;
    c->indexer_types[l] = l == 3 ? INDEX_SHARED : INDEX_FULL;
    L->attn_kind = kinds[l]; L->mlp_kind = c->mlp_layer_types[l]; L->index_kind = c->indexer_types[l];
    L->input_norm = fvec(D, 1, 0.1f); L->post_attn_norm = fvec(D, 1, 0.1f);
    mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    for (int i = 0; i < 2; i++) {
      hs[i]->fn = fvec((size_t)mix * hc * D, 0, 0.01f);
      hs[i]->base = fvec(mix, 0, 0.5f);
      hs[i]->scale = fvec(3, 1, 0.2f);
      bytes += (size_t)mix * hc * D * 4;
    }
    wmat *ws[16];
    int nw = 0;
    if (L->attn_kind == ATTN_KDA) {
      kda_weights *k = &L->kda;
      int H = 64, hd = 128, inner = H * hd;
      bmat(&k->q_proj, inner, D); bmat(&k->k_proj, inner, D); bmat(&k->v_proj, inner, D);
      k->conv = fvec((size_t)3 * inner * 4, 0, 0.5f);
      bmat(&k->f_a, hd, D); bmat(&k->f_b, inner, hd);
      k->dt_bias = fvec(inner, 0, 0.5f); k->A_log = fvec(H, 0, 0.5f);
      bmat(&k->b_proj, H, D); bmat(&k->g_a, hd, D); bmat(&k->g_b, inner, hd);
      k->o_norm = fvec(hd, 1, 0.1f);
      bmat(&k->o_proj, D, inner);
      wmat *x[] = {&k->q_proj, &k->k_proj, &k->v_proj, &k->f_a, &k->f_b, &k->b_proj, &k->g_a, &k->g_b, &k->o_proj};
      for (int i = 0; i < 9; i++) ws[nw++] = x[i];
    } else {
      mla_weights *a = &L->mla;
      bmat(&a->q_a, 1536, D); a->q_a_norm = fvec(1536, 1, 0.1f);
      bmat(&a->q_b, 64 * 256, 1536); bmat(&a->kv_a, 512, D); a->kv_a_norm = fvec(512, 1, 0.1f);
      bmat(&a->kv_b, 64 * 512, 512); bmat(&a->o_proj, D, 64 * 256);
      wmat *x[] = {&a->q_a, &a->q_b, &a->kv_a, &a->kv_b, &a->o_proj};
      for (int i = 0; i < 5; i++) ws[nw++] = x[i];
      a->has_indexer = L->index_kind == INDEX_FULL;
      if (a->has_indexer) {
        indexer_weights *x2 = &a->idx;
        bmat(&x2->wq_b, 32 * 128, 1536); bmat(&x2->wk, 128, D);
        x2->k_norm_w = fvec(128, 1, 0.1f); x2->k_norm_b = fvec(128, 0, 0.1f);
        bmat(&x2->weights_proj, 32, D); bmat(&x2->gate, 128, D);
        x2->ape = fvec(4 * 128, 0, 0.5f);
        wmat *y[] = {&x2->wq_b, &x2->wk, &x2->weights_proj, &x2->gate};
        for (int i = 0; i < 4; i++) ws[nw++] = y[i];
      }
    }
    if (L->mlp_kind == MLP_DENSE) {
      bmlp(&L->dense, D, c->intermediate_size);
      ws[nw++] = &L->dense.gate; ws[nw++] = &L->dense.up; ws[nw++] = &L->dense.down;
    } else {
      moe_weights *e = &L->moe;
      bmat(&e->router, E, D);
      e->bias = fvec(E, 0, 0.01f);
      e->experts = xcalloc((size_t)E, sizeof(mlp_weights));
      for (int i = 0; i < E; i++) bmlp(&e->experts[i], D, 2048);
      bmlp(&e->shared, D, 2048);
      ws[nw++] = &e->router; ws[nw++] = &e->shared.gate; ws[nw++] = &e->shared.up; ws[nw++] = &e->shared.down;
      expert += 8 * 3 * wmat_bytes(&e->experts[0].gate);
    }
    for (int i = 0; i < nw; i++) bytes += wmat_bytes(ws[i]);
  }
  *decode_bytes = bytes + expert;        /* weights one decode token reads (embedding: one row, ignored) */
  /* bf16 matmul parameters one prefill token multiplies (no LM head: prefill returns the last row only) */
  *active_params = (bytes - wmat_bytes(&m->lm_head) - (size_t)6 * 2 * mix * hc * D * 4) / 2.0 + expert / 2.0;
  return m;
}

static double run(glm53_session *s, const int32_t *tok, int n, float *logits) {
  void *a = gk_event_new(), *b = gk_event_new();
  gk_event_record(a);
  if (glm53_forward(s, tok, n, logits, 0)) { fprintf(stderr, "forward: %s\n", glm53_last_error()); exit(1); }
  gk_event_record(b);
  double ms = gk_event_ms(a, b);
  gk_event_free(a); gk_event_free(b);
  return ms;
}

static double decode(glm53_session *s, int steps, const int32_t *tok, float *logits) {
  for (int i = 0; i < 3; i++) run(s, tok + i, 1, logits); /* warm-up */
  double t0 = now_sec();
  for (int i = 0; i < steps; i++) glm53_forward(s, tok + 3 + i, 1, logits, 0);
  return (now_sec() - t0) / steps;
}

/* achieved bandwidth of the decode GEMV (n = 1, bf16) at model shapes */
static void gemv_shapes(double bw) {
  static const int shapes[][2] = {{154880, 4096}, {12288, 4096}, {8192, 4096}, {4096, 8192}, {2048, 4096}, {4096, 2048}, {128, 4096}};
  float *x = gk_malloc(16384 * 4), *y = gk_malloc((size_t)154880 * 4);
  gk_fill_random(x, 16384 * 4, 3); /* any finite values will do for timing */
  for (size_t i = 0; i < 2 * sizeof shapes / sizeof *shapes; i++) {
    int q4 = i >= sizeof shapes / sizeof *shapes;
    const int *sh = shapes[i % (sizeof shapes / sizeof *shapes)];
    gpu_mat W = {.fmt = q4 ? WMAT_Q4 : WMAT_BF16, .rows = sh[0], .cols = sh[1], .group = 32, .scale_bf16 = 1};
    size_t nb = q4 ? (size_t)W.rows * W.cols / 2 + (size_t)W.rows * W.cols / 32 * 2 : (size_t)W.rows * W.cols * 2;
    void *d = gk_malloc(nb);
    gk_fill_random(d, nb, 5);
    W.d = d;
    if (q4) W.s = (char *)d + (size_t)W.rows * W.cols / 2;
    int reps = nb > (100u << 20) ? 20 : 200;
    void *a = gk_event_new(), *b = gk_event_new();
    float *hy[2] = {xmalloc((size_t)W.rows * 4), xmalloc((size_t)W.rows * 4)};
    for (int v = 1; v <= 2; v++) { /* previous kernel, then the current one */
      gk_set_gemv_version(v);
      gk_matmul(&W, x, 1, W.cols, y, W.rows);
      gk_event_record(a);
      for (int r = 0; r < reps; r++) gk_matmul(&W, x, 1, W.cols, y, W.rows);
      gk_event_record(b);
      double us = gk_event_ms(a, b) * 1e3 / reps;
      printf("gemv v%d %s %6d x %5d: %7.1f us, %5.0f GB/s (%.0f%% of copy bw)\n", v, q4 ? "q4  " : "bf16", W.rows, W.cols, us,
             nb / us / 1e3, 100.0 * nb / us / 1e3 / bw);
      gk_d2h(hy[v - 1], y, (size_t)W.rows * 4);
    }
    printf("gemv v1 vs v2 %s %d x %d: %s\n", q4 ? "q4" : "bf16", W.rows, W.cols,
           memcmp(hy[0], hy[1], (size_t)W.rows * 4) ? "OUTPUTS DIFFER" : "bitwise equal");
    free(hy[0]); free(hy[1]);
    gk_set_gemv_version(0);
    gk_event_free(a); gk_event_free(b);
    gk_free(d);
  }
  gk_free(x); gk_free(y);
}

/* decode at short context for several routed-expert budgets */
static int stream_bench(glm53_model *m, int E, int steps, size_t dbytes) {
  double h2d = gk_time_h2d_gbs((size_t)1 << 30, 8);
  printf("host->device (pinned cudaMemcpyAsync, 1 GiB x 8): %.1f GB/s\n", h2d);
  const glm53_config *c = &m->cfg;
  double blob = 3.0 * c->moe_intermediate_size * c->hidden_size * 2; /* bf16 gate+up+down */
  double total = blob * E * 5;
  static const double fr[] = {-1, 0.75, 0.5, 0.25, 0};
  const int V = c->vocab_size, ctx = 64 + steps + 16;
  int32_t *tok = xmalloc((size_t)ctx * sizeof(int32_t));
  for (int i = 0; i < ctx; i++) tok[i] = (int32_t)(mix64(i + 17) % V);
  float *logits = xmalloc((size_t)V * sizeof(float));
  for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) {
    if (m->backend->model_free) m->backend->model_free(m);
    m->backend = glm53_cpu_backend();
    m->gpu_expert_gb = fr[i] < 0 ? -1 : fr[i] > 0 ? fr[i] * total / 1e9 : 1e-12;
    double t0 = now_sec();
    if (glm53_backend_select(m, "gpu")) { printf("gpu backend: %s\n", glm53_last_error()); return 1; }
    double tinit = now_sec() - t0;
    glm53_gpu_expert_stats st;
    glm53_gpu_expert_stats_get(m, &st);
    glm53_session *s = glm53_session_new(m, ctx);
    if (!s) { printf("session: %s\n", glm53_last_error()); return 1; }
    run(s, tok, 64, logits);
    for (int w = 0; w < 3; w++) run(s, tok + 64 + w, 1, logits);
    glm53_gpu_expert_stats_reset(m);
    double t1 = now_sec();
    for (int k = 0; k < steps; k++) glm53_forward(s, tok + 67 + k, 1, logits, 0);
    double dt = (now_sec() - t1) / steps;
    glm53_gpu_expert_stats_get(m, &st);
    unsigned long long u = st.hits + st.misses;
    double gbt = st.bytes_h2d / 1e9 / steps;
    printf("stream budget %5.2f GB (%3.0f%% of %.2f GB experts): %3ld resident, %3ld streamed, %3d slots; decode %.2f ms/token = "
           "%.1f tok/s; hit rate %5.1f%% (%llu hits, %llu misses), %.3f GB/token copied = %.0f%% of the step at the measured "
           "H2D bandwidth; init %.1f s\n",
           fr[i] < 0 ? total / 1e9 : m->gpu_expert_gb, fr[i] < 0 ? 100.0 : 100 * fr[i], total / 1e9, st.resident, st.streamed,
           st.slots, dt * 1e3, 1 / dt, u ? 100.0 * st.hits / u : 100.0, st.hits, st.misses, gbt,
           h2d > 0 ? 100.0 * gbt / h2d / dt : 0.0, tinit);
    glm53_session_free(s);
  }
  (void)dbytes;
  free(tok); free(logits);
  glm53_model_free(m);
  return 0;
}

int main(int argc, char **argv) {
  int E = argc > 1 ? atoi(argv[1]) : 32, steps = argc > 2 ? atoi(argv[2]) : 32;
  const char *mode = argc > 3 ? argv[3] : "bf16";
  if (strcmp(mode, "bf16") && strcmp(mode, "q4") && strcmp(mode, "stream")) { fprintf(stderr, "unknown mode %s\n", mode); return 2; }
  g_q4 = !strcmp(mode, "q4");
  unsetenv("GLM53_GPU_EXPERT_GB");
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) { printf("SKIP: no GPU device (%s)\n", why); return 0; }
  printf("device: %s\n", glm53_gpu_device_desc());
  double bw = gk_time_d2d_gbs((size_t)2 << 30, 20);
  double tf = gk_time_bf16_gemm_tflops(8192, 8192, 8192, 10);
  printf("ceilings: D2D copy %.0f GB/s (read+write), bf16 cuBLAS GEMM 8192^3 %.0f TFLOP/s\n", bw, tf);
  if (strcmp(mode, "stream")) gemv_shapes(bw);
  size_t dbytes;
  double active;
  double t0 = now_sec();
  glm53_model *m = synth(E, &dbytes, &active);
  printf("synthetic model: 6 layers, %d experts, %s, built in %.1f s\n", E, g_q4 ? "q4 (group 32)" : "bf16", now_sec() - t0);
  if (!strcmp(mode, "stream")) return stream_bench(m, E, steps, dbytes);
  t0 = now_sec();
  if (glm53_backend_select(m, "gpu")) { printf("gpu backend: %s\n", glm53_last_error()); return 1; }
  printf("gpu model_init (validation + upload) %.1f s\n", now_sec() - t0);
  const int V = m->cfg.vocab_size, NP = 4096, ctx = NP + steps + 16;
  int32_t *tok = xmalloc((size_t)ctx * sizeof(int32_t));
  for (int i = 0; i < ctx; i++) tok[i] = (int32_t)(mix64(i + 17) % V);
  float *logits = xmalloc((size_t)V * sizeof(float));

  glm53_session *s = glm53_session_new(m, ctx);
  if (!s) { printf("session: %s\n", glm53_last_error()); return 1; }
  run(s, tok, 64, logits);
  double dt = decode(s, steps, tok + 64, logits);
  glm53_gpu_profile_dump("(warm-up + short-context decode)");
  printf("decode @ctx 64 (%s, %d experts):   %.2f ms/token = %.1f tok/s; weights read %.2f GB/token -> %.0f GB/s (%.0f%% of copy bw)\n",
         mode, E, dt * 1e3, 1 / dt, dbytes / 1e9, dbytes / dt / 1e9, 100.0 * dbytes / dt / 1e9 / bw);
  if (g_q4) { /* Q4: decode only (the prefill GEMMs dequantise per call) */
    glm53_session_free(s);
    glm53_model_free(m);
    free(tok); free(logits);
    return 0;
  }
  glm53_session_reset(s);
  run(s, tok, 512, logits); /* warm-up of the GEMM shapes */
  glm53_session_reset(s);
  glm53_gpu_profile_dump("(discarded)");
  double pms = run(s, tok, NP, logits);
  glm53_gpu_profile_dump("prefill 4096");
  double pf = 2.0 * active * NP / (pms * 1e-3) / 1e12;
  printf("prefill %d tokens: %.1f ms = %.0f tok/s; %.1f TFLOP/s in weight GEMMs (%.1f%% of measured bf16 GEMM)\n", NP, pms,
         NP / (pms * 1e-3), pf, 100.0 * pf / tf);
  dt = decode(s, steps, tok + NP, logits);
  glm53_gpu_profile_dump("decode @ctx 4096 (incl. 3 warm-up steps)");
  printf("decode @ctx %d: %.2f ms/token = %.1f tok/s; %.0f GB/s weights (%.0f%% of copy bw)\n", NP, dt * 1e3, 1 / dt,
         dbytes / dt / 1e9, 100.0 * dbytes / dt / 1e9 / bw);
  glm53_session_free(s);
  glm53_model_free(m);
  free(tok); free(logits);
  return 0;
}
