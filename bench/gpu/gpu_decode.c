/* GPU speed on a synthetic model with GLM-5.3-Flash's real dimensions
 * (hidden 4096, 64 MLA heads with kv_lora 512 / q_lora 1536 / nope 256 /
 * v 256, KDA 64 heads x 128, indexer 32 x 128 with kpool 4 / topk 2048,
 * experts 2048 wide top-8, dense MLP 12288, vocab 154880, hc 4) scaled down
 * with all 45 layers of the release schedule (34 KDA, 11 MLA+DSA, layers
 * 0-2 dense MLP) and fewer routed experts (default 32), bf16 weights
 * except the router and the indexer's head weights, fp32 as converted
 * checkpoints keep them (bench/gpu/synth_model.h; since the twentieth
 * session, GLM53_BENCH_BF16_ROUTER=1 for bf16 as before); a 6-layer
 * variant for quick runs.
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
 *      next to the pinned host->device bandwidth measured in the same run,
 *      in each look-ahead mode (all guesses, idle: the default, off).
 * GLM53_GPU_KPROF=1 (with GLM53_GPU_GRAPH=0): instead of the timings, the
 *      per-operation GPU time of decode and prefill (gk_kprof.cu).
 * GLM53_BENCH_DECODE_ONLY=1: the ceilings and the short-context decode
 *      line only (for a trace of decode steps, e.g. under nsys).
 * Usage: gpu_decode [experts=32] [decode_steps=32] [bf16|q4|stream] [layers=45, stream: 6] */
#include "glm53.h"
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "model/model.h"
#include "model/backend.h"
#include "core/util.h"
#include "synth_model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* n pseudo-random token ids below V (the same sequence every run) */
static int32_t *synth_tokens(int n, int V) {
  int32_t *tok = xmalloc((size_t)n * sizeof(int32_t));
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(mix64(i + 17) % V);
  return tok;
}

static double max_diff(const float *a, const float *b, int n) {
  double d = 0;
  for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
  return d;
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

static double median3(const double *v) {
  const double a = v[0], b = v[1], c = v[2];
  return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* kernels launched by the last decode()'s first step (the one that
 * captures the step's graph, whose replays launch nothing one by one) */
static unsigned long g_step_launches;
static double decode(glm53_session *s, int steps, const int32_t *tok, float *logits) {
  const unsigned long l0 = gk_launch_count();
  run(s, tok, 1, logits);
  g_step_launches = gk_launch_count() - l0;
  for (int i = 1; i < 3; i++) run(s, tok + i, 1, logits); /* warm-up */
  double t0 = now_sec();
  for (int i = 0; i < steps; i++) glm53_forward(s, tok + 3 + i, 1, logits, 0);
  return (now_sec() - t0) / steps;
}

/* Decode at context 64 with the L2 prefetch and trigger-order settings
 * given (gk.h: gk_set_pdl_early, gk_set_gemv_l2pf, gk_set_expert_l2pf) and
 * the KDA recurrence's layout (gk_set_kda_layout) in a fresh session (its
 * graphs capture the launch parameters), then the defaults back. */
/* branch, rgroup, sgroup: gk_set_branch / gk_set_route_group /
 * gk_set_shared_group (-1: the default); opt: OPT_* bits (0: the
 * defaults), the MoE post's latency form off or an opt-in launch fusion on */
enum { OPT_NO_POST_LAT = 1, OPT_ROUTE_FUSE = 2, OPT_IDX_FUSE = 4, OPT_PRE_FUSE = 8, OPT_KDA_OUT_FUSE = 16 };
typedef struct { const char *what; int early, pfb, last; long xpf; int kda_layout, branch, rgroup, sgroup, opt; } decode_var;
static double decode_variant(glm53_model *m, const decode_var *v, int steps, const int32_t *tok, float *logits) {
  gk_set_pdl_early(v->early);
  gk_set_gemv_l2pf(v->pfb, v->last);
  gk_set_expert_l2pf(v->xpf);
  gk_set_kda_layout(v->kda_layout);
  gk_set_branch(v->branch);
  gk_set_route_group(v->rgroup);
  gk_set_shared_group(v->sgroup);
  gk_set_mhc_post_lat(v->opt & OPT_NO_POST_LAT ? 0 : -1);
  gk_set_route_fuse(v->opt & OPT_ROUTE_FUSE ? 1 : -1);
  gk_set_idx_fuse(v->opt & OPT_IDX_FUSE ? 1 : -1);
  gk_set_mhc_pre_fuse(v->opt & OPT_PRE_FUSE ? 1 : -1);
  gk_set_kda_out_fuse(v->opt & OPT_KDA_OUT_FUSE ? 1 : -1);
  glm53_session *s = glm53_session_new(m, 64 + steps + 16);
  if (!s) { printf("session: %s\n", glm53_last_error()); exit(1); }
  run(s, tok, 64, logits);
  const double dt = decode(s, steps, tok + 64, logits);
  glm53_session_free(s);
  gk_set_pdl_early(-1);
  gk_set_gemv_l2pf(-1, -1);
  gk_set_expert_l2pf(-1);
  gk_set_kda_layout(0);
  gk_set_branch(-1);
  gk_set_route_group(-1);
  gk_set_shared_group(-1);
  gk_set_mhc_post_lat(-1);
  gk_set_decode_fusions(-1);
  return dt;
}
/* the eighth session measured every L2 prefetch variant slower (docs/gpu.md):
 * two are kept as a check, with the KDA layouts' decode cost */
static void decode_sweep(glm53_model *m, int steps, const int32_t *tok, float *logits, size_t dbytes, double bw) {
  static const decode_var vs[] = {
      {"the defaults (late trigger, no L2 prefetch, KDA layout g4)", 0, 0, 1, 0, 0, -1, -1, -1, 0},
      {"early trigger only", 1, 0, 1, 0, 0, -1, -1, -1, 0},
      {"GEMV L2 prefetch 4 KB/row only (late trigger)", 0, 4096, 1, 0, 0, -1, -1, -1, 0},
      {"KDA layout w4 (GLM53_GPU_KDA_LAYOUT)", 0, 0, 1, 0, GK_KR_W4, -1, -1, -1, 0},
      {"KDA layout g2", 0, 0, 1, 0, GK_KR_G2, -1, -1, -1, 0},
      {"the defaults again (drift)", 0, 0, 1, 0, 0, -1, -1, -1, 0},
  };
  for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) {
    const double dt = decode_variant(m, &vs[i], steps, tok, logits);
    printf("decode @ctx 64, %s: %.2f ms/token = %.1f tok/s (%.0f%% of copy bw)\n", vs[i].what, dt * 1e3, 1 / dt,
           100.0 * dbytes / dt / 1e9 / bw);
  }
}

/* the newest decode changes (GLM53_BENCH_QUICK too), the twenty-second
 * session's opt-in launch fusions: the routing inside the router's launch,
 * the mHC pre inside its projection's (one token), the MLA's state stores
 * inside the norms' and one indexer launch, the KDA gated norm inside the
 * recurrence's; each alone, then all four; two rounds, interleaved, for
 * the drift */
static void decode_ab(glm53_model *m, int steps, const int32_t *tok, float *logits, size_t dbytes, double bw) {
  static const decode_var vs[] = {
      {"the defaults", 0, 0, 1, 0, 0, -1, -1, -1, 0},
      {"route in the router launch (GLM53_GPU_ROUTE_FUSE=1)", 0, 0, 1, 0, 0, -1, -1, -1, OPT_ROUTE_FUSE},
      {"mHC pre in the projection launch (GLM53_GPU_MHC_PRE_FUSE=1)", 0, 0, 1, 0, 0, -1, -1, -1, OPT_PRE_FUSE},
      {"indexer stores fused (GLM53_GPU_IDX_FUSE=1)", 0, 0, 1, 0, 0, -1, -1, -1, OPT_IDX_FUSE},
      {"KDA gated norm in the recurrence (GLM53_GPU_KDA_OUT_FUSE=1)", 0, 0, 1, 0, 0, -1, -1, -1, OPT_KDA_OUT_FUSE},
      {"all four fusions", 0, 0, 1, 0, 0, -1, -1, -1,
       OPT_ROUTE_FUSE | OPT_IDX_FUSE | OPT_PRE_FUSE | OPT_KDA_OUT_FUSE},
  };
  for (int round = 0; round < 2; round++)
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) {
      const double dt = decode_variant(m, &vs[i], steps, tok, logits);
      printf("decode @ctx 64 (round %d), %s: %.2f ms/token = %.1f tok/s (%.1f%% of copy bw), %lu launches per token\n",
             round + 1, vs[i].what, dt * 1e3, 1 / dt, 100.0 * dbytes / dt / 1e9 / bw, g_step_launches);
    }
}

/* decode at short context for several routed-expert budgets */
static int stream_bench(glm53_model *m, int E, int steps, size_t dbytes) {
  double h2d = gk_time_h2d_gbs((size_t)1 << 30, 8);
  printf("host->device (pinned cudaMemcpyAsync, 1 GiB x 8): %.1f GB/s\n", h2d);
  const glm53_config *c = &m->cfg;
  double blob = 3.0 * c->moe_intermediate_size * c->hidden_size * 2; /* bf16 gate+up+down */
  int moe_layers = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) moe_layers += c->mlp_layer_types[l] == MLP_MOE;
  double total = blob * E * moe_layers;
  static const double fr[] = {-1, 0.75, 0.5, 0.25, 0};
  const int V = c->vocab_size, ctx = 64 + 3 * steps + 16;
  int32_t *tok = synth_tokens(ctx, V);
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
    /* each look-ahead mode in turn: every guess copied, the default
     * (one guess after a copy-free layer call), none; continuing the same
     * sequence (positions 67.., 67 + steps.., 67 + 2 steps..) */
    static const int modes[] = {GLM53_GPU_LA_ALL, GLM53_GPU_LA_IDLE, GLM53_GPU_LA_OFF};
    static const char *mname[] = {"all ", "idle", "off "};
    for (int mi = 0; mi < 3; mi++) {
      glm53_gpu_set_expert_lookahead(modes[mi]);
      glm53_gpu_expert_stats_reset(m);
      const int32_t *tk = tok + 67 + mi * steps;
      double t1 = now_sec();
      for (int k = 0; k < steps; k++) glm53_forward(s, tk + k, 1, logits, 0);
      double dt = (now_sec() - t1) / steps;
      glm53_gpu_expert_stats_get(m, &st);
      unsigned long long u = st.hits + st.misses;
      double gbt = st.bytes_h2d / 1e9 / steps;
      printf("stream budget %5.2f GB (%3.0f%% of %.2f GB experts), look-ahead %s: %3ld resident, %3ld streamed, %3d slots; "
             "decode %.2f ms/token = %.1f tok/s; hit rate %5.1f%% (%llu hits, %llu misses; %llu look-ahead copies, %llu "
             "used), %.3f GB/token copied = %.0f%% of the step at the measured H2D bandwidth; init %.1f s\n",
             fr[i] < 0 ? total / 1e9 : m->gpu_expert_gb, fr[i] < 0 ? 100.0 : 100 * fr[i], total / 1e9,
             !st.streaming ? "n/a " : mname[mi],
             st.resident, st.streamed, st.slots, dt * 1e3, 1 / dt, u ? 100.0 * st.hits / u : 100.0, st.hits, st.misses,
             st.prefetches, st.prefetch_hits, gbt, h2d > 0 ? 100.0 * gbt / h2d / dt : 0.0, tinit);
      if (fr[i] < 0) break; /* all resident: nothing streamed */
    }
    glm53_gpu_set_expert_lookahead(-1);
    glm53_session_free(s);
  }
  (void)dbytes;
  free(tok); free(logits);
  glm53_model_free(m);
  return 0;
}

/* GLM53_GPU_KPROF=1: per-operation GPU time (gk_kprof.cu) of 8 decode
 * steps at context 64, a 4096-token prefill and 8 decode steps after it,
 * instead of the timings (graphs off) */
static int kprof_bench(glm53_model *m, const char *mode) {
  const int V = m->cfg.vocab_size, NP = 4096, steps = 8, ctx = NP + 3 * steps + 16;
  int32_t *tok = synth_tokens(ctx, V);
  float *logits = xmalloc((size_t)V * sizeof(float));
  glm53_session *s = glm53_session_new(m, ctx);
  if (!s) { printf("session: %s\n", glm53_last_error()); return 1; }
  run(s, tok, 64, logits);
  decode(s, 2, tok + 64, logits); /* warm-up */
  if (gk_kprof_begin()) { printf("kprof: %s\n", gk_error()); return 1; }
  for (int i = 0; i < steps; i++) glm53_forward(s, tok + 69 + i, 1, logits, 0);
  gk_kprof_end(!strcmp(mode, "q4") ? "q4 decode @ctx 64" : "bf16 decode @ctx 64", steps);
  if (strcmp(mode, "q4")) {
    glm53_session_reset(s);
    run(s, tok, NP, logits); /* warm-up: scratch sizes and cuBLAS plans of the 4096-token shapes */
    glm53_session_reset(s);
    gk_kprof_begin();
    run(s, tok, NP, logits);
    gk_kprof_end("bf16 prefill 4096", 1);
    decode(s, 2, tok + NP, logits);
    gk_kprof_begin();
    for (int i = 0; i < steps; i++) glm53_forward(s, tok + NP + 5 + i, 1, logits, 0);
    gk_kprof_end("bf16 decode @ctx 4096", steps);
  }
  glm53_session_free(s);
  glm53_model_free(m);
  free(tok); free(logits);
  return 0;
}

int main(int argc, char **argv) {
  int E = argc > 1 ? atoi(argv[1]) : 32, steps = argc > 2 ? atoi(argv[2]) : 32;
  const char *mode = argc > 3 ? argv[3] : "bf16";
  const int nl = argc > 4 ? atoi(argv[4]) : !strcmp(mode, "stream") ? 6 : 45;
  if (nl != 6 && (nl < 4 || nl > 45)) { fprintf(stderr, "layers: 6, or 4..45 of the release schedule\n"); return 2; }
  if (strcmp(mode, "bf16") && strcmp(mode, "q4") && strcmp(mode, "stream")) { fprintf(stderr, "unknown mode %s\n", mode); return 2; }
  g_q4 = !strcmp(mode, "q4");
  /* GLM53_BENCH_QUICK=1: the default runs and the newest A/B only (the
   * decode sweep and the older prefill variants take minutes of device time) */
  const int quick = getenv("GLM53_BENCH_QUICK") && !strcmp(getenv("GLM53_BENCH_QUICK"), "1");
  unsetenv("GLM53_GPU_EXPERT_GB");
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) { printf("SKIP: no GPU device (%s)\n", why); return 0; }
  printf("device: %s\n", glm53_gpu_device_desc());
  double bw = gk_time_d2d_gbs((size_t)2 << 30, 20);
  double tf = gk_time_bf16_gemm_tflops(8192, 8192, 8192, 10);
  printf("ceilings: D2D copy %.0f GB/s (read+write), bf16 cuBLAS GEMM 8192^3 %.0f TFLOP/s\n", bw, tf);
  size_t dbytes;
  double active;
  double t0 = now_sec();
  glm53_model *m = synth(E, nl, &dbytes, &active);
  const char *rb = getenv("GLM53_BENCH_BF16_ROUTER");
  printf("synthetic model: %d layers, %d experts, %s, router and indexer head weights %s, built in %.1f s\n", nl, E,
         g_q4 ? "q4 (group 32)" : "bf16", rb && !strcmp(rb, "1") ? (g_q4 ? "q4" : "bf16") : "fp32", now_sec() - t0);
  if (!strcmp(mode, "stream")) return stream_bench(m, E, steps, dbytes);
  t0 = now_sec();
  if (glm53_backend_select(m, "gpu")) { printf("gpu backend: %s\n", glm53_last_error()); return 1; }
  printf("gpu model_init (validation + upload) %.1f s\n", now_sec() - t0);
  if (getenv("GLM53_GPU_KPROF") && !strcmp(getenv("GLM53_GPU_KPROF"), "1")) return kprof_bench(m, mode);
  const int V = m->cfg.vocab_size, NP = 4096, ctx = NP + steps + 16;
  int32_t *tok = synth_tokens(ctx, V);
  float *logits = xmalloc((size_t)V * sizeof(float));

  glm53_session *s = glm53_session_new(m, ctx);
  if (!s) { printf("session: %s\n", glm53_last_error()); return 1; }
  run(s, tok, 64, logits);
  double dt = decode(s, steps, tok + 64, logits);
  glm53_gpu_profile_dump("(warm-up + short-context decode)");
  printf("decode @ctx 64 (%s, %d experts):   %.2f ms/token = %.1f tok/s; weights read %.2f GB/token -> %.0f GB/s (%.0f%% of copy bw); %lu launches per token\n",
         mode, E, dt * 1e3, 1 / dt, dbytes / 1e9, dbytes / dt / 1e9, 100.0 * dbytes / dt / 1e9 / bw, g_step_launches);
  printf("L2 prefetch: GEMV %d bytes per row before its wait, experts %.0f MB at routing, PDL trigger %s\n", gk_gemv_l2pf(),
         gk_expert_l2pf() / 1048576.0, gk_pdl_early() ? "early" : "late");
  /* GLM53_BENCH_DECODE_ONLY=1: stop here (a trace of the decode steps
   * alone, e.g. under nsys with graph nodes traced) */
  if (getenv("GLM53_BENCH_DECODE_ONLY") && !strcmp(getenv("GLM53_BENCH_DECODE_ONLY"), "1")) {
    glm53_session_free(s);
    glm53_model_free(m);
    free(tok); free(logits);
    return 0;
  }
  decode_ab(m, steps, tok, logits, dbytes, bw);
  if (gk_pdl_supported() && !quick) { /* the L2 prefetch settings and KDA layouts, then no programmatic dependent launch (fresh sessions: their own graphs) */
    decode_sweep(m, steps, tok, logits, dbytes, bw);
    gk_force_pdl_off(1);
    glm53_session *s2 = glm53_session_new(m, 64 + steps + 16);
    if (!s2) { printf("session: %s\n", glm53_last_error()); return 1; }
    run(s2, tok, 64, logits);
    double d2 = decode(s2, steps, tok + 64, logits);
    printf("decode @ctx 64 without PDL: %.2f ms/token = %.1f tok/s (PDL saves %.2f ms/token)\n", d2 * 1e3, 1 / d2,
           (d2 - dt) * 1e3);
    glm53_session_free(s2);
    gk_force_pdl_off(0);
  }
  if (g_q4) { /* Q4: decode only (the prefill GEMMs dequantise per call) */
    glm53_session_free(s);
    glm53_model_free(m);
    free(tok); free(logits);
    return 0;
  }
  /* the first 4096-token prefill also grows the scratch buffers and has
   * cuBLAS plan its new shapes: reported apart, then the median of 3 */
  glm53_session_reset(s);
  double first = run(s, tok, NP, logits);
  glm53_gpu_profile_dump("(discarded)");
  double pr[3];
  for (int i = 0; i < 3; i++) {
    glm53_session_reset(s);
    pr[i] = run(s, tok, NP, logits);
    glm53_gpu_profile_dump("prefill 4096");
  }
  double pms = median3(pr);
  printf("prefill %d tokens, first in the process (scratch allocation, cuBLAS plans): %.1f ms\n", NP, first);
  double pf = 2.0 * active * NP / (pms * 1e-3) / 1e12;
  printf("prefill %d tokens (median of 3): %.1f ms = %.0f tok/s; %.1f TFLOP/s in weight GEMMs (%.1f%% of measured bf16 GEMM); MLA GEMM form %s in %s; mHC projection %s\n",
         NP, pms, NP / (pms * 1e-3), pf, 100.0 * pf / tf,
         !gk_mla_mha_on() ? "absorbed" : !gk_mla_flash_fits(256, 256, 4) ? "per-head" : gk_mla_flash_wg() ? "per-head, fused (wgmma)" : gk_mla_flash_bn() == 32 ? "per-head, fused (mma.sync, 32 keys per tile)" : "per-head, fused (mma.sync, 64 keys per tile)",
         gk_mla_math_name(gk_mla_math()), gk_mhc_tc_on() ? "tensor cores" : "SIMT");
  dt = decode(s, steps, tok + NP, logits);
  glm53_gpu_profile_dump("decode @ctx 4096 (incl. 3 warm-up steps)");
  printf("decode @ctx %d: %.2f ms/token = %.1f tok/s; %.0f GB/s weights (%.0f%% of copy bw)\n", NP, dt * 1e3, 1 / dt,
         dbytes / dt / 1e9, 100.0 * dbytes / dt / 1e9 / bw);
  /* each prefill variant's last-token logits against the default's: a
   * rounding-level change (another summation order) already moves them
   * on this random 45-layer model (routing and top-k near-ties), which is
   * the scale to read the chunked KDA form's difference against */
  float *base = xmalloc((size_t)V * sizeof(float));
  glm53_session_reset(s);
  run(s, tok, NP, base);
  /* prefill A/B within the run: the MLA GEMM form's other arithmetics */
  const int dflt = gk_mla_math();
  for (int mode = GK_MLA_FP32; mode < GK_MLA_NMATH && !quick; mode++) {
    if (mode == dflt) continue;
    gk_set_mla_math(mode);
    glm53_session_reset(s);
    pms = run(s, tok, NP, logits);
    glm53_gpu_profile_dump("prefill 4096 (variant)");
    printf("prefill %d tokens, MLA GEMM form in %s instead of %s (GLM53_GPU_MLA_MATH=%s): %.1f ms = %.0f tok/s; "
           "last-token logits max |diff| %.3g\n",
           NP, gk_mla_math_name(mode), gk_mla_math_name(dflt), gk_mla_math_name(mode), pms, NP / (pms * 1e-3),
           max_diff(logits, base, V));
  }
  gk_set_mla_math(-1);
  /* prefill A/B: the per-head form's batched GEMMs instead of its fused
   * kernel, the absorbed bf16x3 form, the mHC projection's SIMT kernel
   * instead of its tensor-core form, the mHC post fused with the next
   * projection, the MoE gather from fp32 rows, the mma.sync flash kernel
   * where the wgmma one is the default, the wgmma kernel's 32-key tiles in
   * two stages, the mHC projection's 32-column steps, the KDA recurrence
   * with 16 and 32 lanes per column (g4's bits), the first three together,
   * the side stream on, the MoE GEMM form's outputs in fp32, the KDA q /
   * k / v products as one merged GEMM, the KDA projections in bf16, no
   * bf16 copy of y from the mHC pre, the MoE gather from a bf16 copy made
   * right before it, the MLA queries written in bf16 by their GEMM, and
   * the defaults again (drift over the run); median of 3 each */
  static const char *const vname[20][2] = {{"MLA per-head form in batched GEMMs", "GLM53_GPU_MLA_FLASH=0"},
                                          {"MLA absorbed GEMM form", "GLM53_GPU_MLA_MHA=0"},
                                          {"mHC projection SIMT kernel", "GLM53_GPU_MHC_TC=0"},
                                          {"MLA fused mma.sync kernel, 64 keys per tile", "GLM53_GPU_MLA_FLASH_WG=0 GLM53_GPU_MLA_FLASH_BN=64"},
                                          {"mHC post fused with the next projection", "GLM53_GPU_MHC_FUSE=1"},
                                          {"MoE gather from fp32 rows", "GLM53_GPU_MOE_X16=0"},
                                          {"MLA fused mma.sync kernel, 32 keys per tile", "GLM53_GPU_MLA_FLASH_WG=0"},
                                          {"MLA wgmma kernel, 32-key tiles in two stages", "GLM53_GPU_MLA_FLASH_WG_BN=32"},
                                          {"mHC projection in 32-column steps", "GLM53_GPU_MHC_K32=1"},
                                          {"KDA recurrence with 16 lanes per column", "GLM53_GPU_KDA_LAYOUT=x4"},
                                          {"KDA recurrence with 32 lanes per column", "GLM53_GPU_KDA_LAYOUT=y4"},
                                          {"the wgmma 32-key tiles, mHC 32-column steps, KDA x4 together", "GLM53_GPU_MLA_FLASH_WG_BN=32 GLM53_GPU_MHC_K32=1 GLM53_GPU_KDA_LAYOUT=x4"},
                                          {"the side stream on", "GLM53_GPU_SIDE=1"},
                                          {"the MoE GEMM form's outputs in fp32", "GLM53_GPU_MOE_OUT=f32"},
                                          {"the KDA q, k, v products as one merged GEMM", "GLM53_GPU_GEMM_MERGE=1"},
                                          {"the KDA q, k, v projections in bf16", "GLM53_GPU_KDA_RAW=bf16"},
                                          {"no bf16 copy of y from the mHC pre", "GLM53_GPU_XB_ALIAS=0"},
                                          {"the MoE gather from a fresh bf16 copy", "GLM53_GPU_MOE_X16=fresh"},
                                          {"the MLA queries rounded by a pass of their own", "GLM53_GPU_MLA_Q16=0"},
                                          {"the defaults again", "-"}};
  for (int v = 0; v < 20; v++) {
    if (quick && v < 16) continue; /* the newest A/B only */
    if (v == 7 && !gk_mla_flash_wg()) continue;
    if (v == 6 && !gk_mla_flash_wg()) continue; /* no wgmma kernel here: the mma.sync one is the default */
    if (v == 0) gk_set_mla_flash(0);
    if (v == 1) gk_set_mla_mha(0);
    if (v == 2) gk_set_mhc_tc(0);
    if (v == 3) gk_set_mla_flash_wg(0), gk_set_mla_flash_bn(64);
    if (v == 4) gk_set_mhc_fuse(1);
    if (v == 5) gk_set_moe_x16(0);
    if (v == 6) gk_set_mla_flash_wg(0);
    if (v == 7 || v == 11) gk_set_mla_flash_wg_bn(32);
    if (v == 8 || v == 11) gk_set_mhc_k32(1);
    if (v == 9 || v == 11) gk_set_kda_layout(GK_KR_X4);
    if (v == 10) gk_set_kda_layout(GK_KR_Y4);
    if (v == 12) gk_set_side(1);
    if (v == 13) gk_set_moe_bf16_out(0);
    if (v == 14) gk_set_gemm_merge(1);
    if (v == 15) gk_set_kda_raw16(1);
    if (v == 16) gk_set_xb_alias(0);
    if (v == 17) gk_set_moe_x16(2);
    if (v == 18) gk_set_mla_q16(0);
    for (int i = 0; i < 3; i++) {
      glm53_session_reset(s);
      pr[i] = run(s, tok, NP, logits);
      glm53_gpu_profile_dump("prefill 4096 (variant)");
    }
    printf("prefill %d tokens, %s (%s, median of 3): %.1f ms = %.0f tok/s; last-token logits max |diff| %.3g\n", NP,
           vname[v][0], vname[v][1], median3(pr), NP / (median3(pr) * 1e-3), max_diff(logits, base, V));
    gk_set_mla_flash(-1);
    gk_set_mla_mha(-1);
    gk_set_mhc_tc(-1);
    gk_set_mla_flash_bn(-1);
    gk_set_mhc_fuse(-1);
    gk_set_moe_x16(-1);
    gk_set_mla_flash_wg(-1);
    gk_set_mla_flash_wg_bn(-1);
    gk_set_mhc_k32(-1);
    gk_set_kda_layout(0);
    gk_set_side(-1);
    gk_set_moe_bf16_out(-1);
    gk_set_gemm_merge(-1);
    gk_set_kda_raw16(-1);
    gk_set_xb_alias(-1);
    gk_set_mla_q16(-1);
  }
  if (quick) {
    free(base);
    glm53_session_free(s);
    glm53_model_free(m);
    free(tok); free(logits);
    return 0;
  }
  /* prefill A/B: the KDA recurrence's other layouts (another summation
   * order each) */
  {
    static const char *lnm[GK_KR_N] = {"", "w4", "w8", "g1", "g2", "g4", "x2", "x4", "y4"};
    for (int l = GK_KR_W4; l < GK_KR_N; l++) {
      if (l == GK_KR_G4) continue;
      gk_set_kda_layout(l);
      glm53_session_reset(s);
      pms = run(s, tok, NP, logits);
      glm53_gpu_profile_dump("prefill 4096 (variant)");
      printf("prefill %d tokens, KDA recurrence layout %s instead of g4 (GLM53_GPU_KDA_LAYOUT=%s): %.1f ms; "
             "last-token logits max |diff| %.3g\n",
             NP, lnm[l], lnm[l], pms, max_diff(logits, base, V));
    }
    gk_set_kda_layout(0);
  }
  /* prefill A/B: the KDA conv+prep with 1 and 8 tokens per warp instead of 4 (the same bits) */
  for (int nt = 1; nt <= 8; nt += 7) {
    gk_set_kda_conv_nt(nt);
    glm53_session_reset(s);
    pms = run(s, tok, NP, logits);
    glm53_gpu_profile_dump("prefill 4096 (variant)");
    printf("prefill %d tokens, KDA conv+prep with %d tokens per warp instead of 4 (GLM53_GPU_KDA_CONV_NT=%d): %.1f ms\n",
           NP, nt, nt, pms);
  }
  gk_set_kda_conv_nt(0);
  /* prefill A/B: the KDA recurrence in the chunked form (gk_kda_chunk.cu),
   * median of 3 after one warm-up, and how far its last-token logits are
   * from the token form's (fp32 rounding of a random model) */
  {
    float *ref = xmalloc((size_t)V * sizeof(float)), *alt = xmalloc((size_t)V * sizeof(float));
    glm53_session_reset(s);
    run(s, tok, NP, ref);
    gk_set_kda_chunked(1);
    for (int v = 0; v < 3; v++) { /* 64-token chunks factorised, exact; 32 factorised */
      const int len = v < 2 ? 64 : 32;
      gk_set_kda_chunk_len(len);
      gk_set_kda_pairs(v != 1);
      for (int i = 0; i < 4; i++) {
        glm53_session_reset(s);
        double ms = run(s, tok, NP, alt);
        if (i) pr[i - 1] = ms;
        glm53_gpu_profile_dump("prefill 4096 (variant)");
      }
      double mx = 0;
      for (int i = 0; i < V; i++) mx = fmax(mx, fabs(ref[i]));
      const double d = max_diff(alt, ref, V);
      pms = median3(pr);
      printf("prefill %d tokens, KDA recurrence chunked (GLM53_KDA_PREFILL=chunked, %d-token chunks, %s pairs, median "
             "of 3): %.1f ms = %.0f tok/s; last-token logits max |diff| %.3g (largest %.3g)\n",
             NP, len, v == 1 ? "exact" : "factorised", pms, NP / (pms * 1e-3), d, mx);
    }
    gk_set_kda_chunk_len(0);
    gk_set_kda_pairs(-1);
    gk_set_kda_chunked(-1);
    free(ref);
    free(alt);
  }
  free(base);
  glm53_session_free(s);
  /* the MLA attention variants (docs/gpu.md): prefill without the GEMM form
   * (head-sharing core, then the per-head core), decode at 4K context with
   * the per-head core; a fresh session each (graphs are per session) */
  static const char *variant[2] = {"head-sharing core", "per-head core"};
  glm53_gpu_set_mla_gemm(0);
  for (int v = 0; v < 2; v++) {
    gk_set_mla_kernel(v == 0);
    s = glm53_session_new(m, ctx);
    if (!s) { printf("session: %s\n", glm53_last_error()); return 1; }
    pms = run(s, tok, NP, logits);
    glm53_gpu_profile_dump("prefill 4096 (variant)");
    printf("prefill %d tokens, MLA %s (no GEMM form): %.1f ms = %.0f tok/s\n", NP, variant[v], pms, NP / (pms * 1e-3));
    if (v == 1) {
      dt = decode(s, steps, tok + NP, logits);
      printf("decode @ctx %d, MLA %s: %.2f ms/token = %.1f tok/s\n", NP, variant[v], dt * 1e3, 1 / dt);
    }
    glm53_session_free(s);
  }
  gk_set_mla_kernel(1);
  glm53_gpu_set_mla_gemm(1);
  glm53_model_free(m);
  free(tok); free(logits);
  return 0;
}
