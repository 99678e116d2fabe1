/* The whole forward on the GPU against the CPU reference, on the random
 * fixture model (dense and sparse indexer regimes, a shared indexer layer):
 *  - GPU logits vs CPU logits, all rows: max over rows of
 *    max|gpu - cpu| / max|cpu| <= 2e-4 (fp32 throughout, different
 *    summation orders; one routing or top-k flip would show as ~1e-1);
 *  - prefill + decode splits vs one prefill on the GPU: with the cuBLAS path
 *    for long chunks (GLM53_GPU_GEMM_MIN default) within 2e-4, and with the
 *    GEMV path everywhere bit for bit;
 *  - two GPU runs bitwise identical, and identical with programmatic
 *    dependent launch off, and with its early trigger order and the L2
 *    prefetches (one prefill; every token a decode step);
 *  - the latent / indexer caches in 8-token pages (all but the first model);
 *  - the comb branch, the grouping route and the opt-in launch fusions
 *    (route, mHC pre, MLA state stores, KDA gated norm) on and off bitwise;
 *  - the side stream on and off bitwise (bf16 experts: the MoE GEMM path);
 *  - a GPU fault (GLM53_FAULT) mid-decode, glm53_session_fallback_cpu, and
 *    the session continues on the CPU with logits identical to a pure CPU run.
 * No device: SKIP. */
#include "glm53.h"
#include "gpu_test.h"
#include "gpu/kernels/gk.h"
#include "model_fixture.h"
#include <stdlib.h>

static void check_model(int topk, int kpool, int shared, uint64_t seed) {
  glm53_config c;
  fx_config(&c, topk, kpool, shared);
  glm53_model *m = fx_model(&c, seed);
  const int n = 4 * topk + 7, V = c.vocab_size;
  int32_t *tok = xmalloc(n * sizeof(int32_t));
  trng r = {seed + 77};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
  float *cpu = xmalloc((size_t)n * V * 4), *full = xmalloc((size_t)n * V * 4), *other = xmalloc((size_t)n * V * 4);
  float *alt = xmalloc((size_t)n * V * 4);
  fx_run_chunks(m, tok, n, (int[]){n, 0}, cpu);
  CHECK(glm53_backend_select(m, "gpu") == 0, "gpu backend: %s", glm53_last_error());
  if (strcmp(glm53_model_backend(m), "gpu")) { free(tok); free(cpu); free(full); free(other); free(alt); glm53_model_free(m); return; }
  static const int patterns[][6] = {{1, 0}, {5, 0}, {3, 7, 2, 0}, {64, 1, 0}};
  for (int mode = 0; mode < 2; mode++) {
    gk_set_gemm_min(mode ? 1 << 30 : 0); /* 0: default (cuBLAS from gk_gemm_min() tokens); 1: GEMV only */
    fx_run_chunks(m, tok, n, (int[]){n, 0}, full);
    float d = (float)rows_rel_diff(cpu, full, n, V);
    printf("topk=%d kpool=%d shared=%d %s: gpu vs cpu max rel diff %.3g\n", topk, kpool, shared, mode ? "gemv" : "cublas", d);
    CHECK(d <= 2e-4f, "topk=%d kpool=%d shared=%d mode %d: gpu vs cpu %g", topk, kpool, shared, mode, d);
    fx_run_chunks(m, tok, n, (int[]){n, 0}, other);
    CHECK(memcmp(full, other, (size_t)n * V * 4) == 0, "two GPU runs differ (mode %d)", mode);
    for (size_t p = 0; p < sizeof patterns / sizeof *patterns; p++) {
      fx_run_chunks(m, tok, n, patterns[p], other);
      d = (float)rows_rel_diff(full, other, n, V);
      if (mode) CHECK(d == 0.0f, "gemv mode, pattern %zu: prefill/decode differ by %g", p, d);
      else CHECK(d <= 2e-4f, "pattern %zu: prefill/decode differ by %g", p, d);
    }
    /* programmatic dependent launch changes when kernels start, never the
     * bits: one prefill and the all-decode pattern (graph replays) without
     * it, with it (the defaults: late trigger, no L2 prefetch) and with the
     * early trigger and the L2 prefetches (GEMV 4 KB per row, experts 16
     * MB): a kernel reading before its wait, or finishing before its
     * predecessors, would show here */
    if (gk_pdl_supported()) {
      gk_force_pdl_off(1);
      for (int q = 0; q < 2; q++) {
        fx_run_chunks(m, tok, n, q ? patterns[0] : (int[]){n, 0}, alt);
        fx_run_chunks(m, tok, n, q ? patterns[0] : (int[]){n, 0}, other);
        gk_force_pdl_off(0);
        fx_run_chunks(m, tok, n, q ? patterns[0] : (int[]){n, 0}, full);
        CHECK(memcmp(alt, other, (size_t)n * V * 4) == 0 && memcmp(full, other, (size_t)n * V * 4) == 0,
              "mode %d %s: logits with and without PDL differ", mode, q ? "decode" : "prefill");
        gk_set_pdl_early(1);
        gk_set_gemv_l2pf(4096, 1);
        gk_set_expert_l2pf(16L << 20);
        fx_run_chunks(m, tok, n, q ? patterns[0] : (int[]){n, 0}, alt);
        gk_set_pdl_early(-1);
        gk_set_gemv_l2pf(-1, -1);
        gk_set_expert_l2pf(-1);
        CHECK(memcmp(alt, other, (size_t)n * V * 4) == 0, "mode %d %s: logits with the early PDL trigger and L2 prefetches differ", mode,
              q ? "decode" : "prefill");
        gk_force_pdl_off(1);
      }
      gk_force_pdl_off(0);
      printf("topk=%d kpool=%d %s: PDL off / on (late trigger) / on (early trigger, L2 prefetches) bitwise identical\n", topk,
             kpool, mode ? "gemv" : "cublas");
    } else {
      printf("PDL not supported on this device/build: on/off comparison skipped\n");
    }
    /* the decode graph's branch (comb beside the sublayer, gk_branch_fork)
     * and the route launch that also groups the pairs change which launch
     * computes what, never the bits: the all-decode pattern (graph replays;
     * each run a new session, so a new capture) with both off and on */
    gk_set_branch(0);
    gk_set_route_group(0);
    fx_run_chunks(m, tok, n, patterns[0], alt);
    gk_set_branch(1);
    gk_set_route_group(1);
    fx_run_chunks(m, tok, n, patterns[0], other);
    gk_set_branch(-1);
    gk_set_route_group(-1);
    CHECK(memcmp(alt, other, (size_t)n * V * 4) == 0, "mode %d: decode with the comb branch and the grouping route differs",
          mode);
    printf("topk=%d kpool=%d %s: decode without / with the comb branch and the grouping route bitwise identical\n", topk,
           kpool, mode ? "gemv" : "cublas");
    /* the opt-in launch fusions (the routing inside the router's launch,
     * the mHC pre inside its projection's, the MLA's state stores inside
     * the norms' and one indexer launch, the KDA gated norm inside the
     * recurrence's) likewise: every token a decode step, and chunks of 3,
     * 7 and 2 first */
    for (int q = 0; q < 2; q++) {
      const int *pat = q ? patterns[2] : patterns[0];
      fx_run_chunks(m, tok, n, pat, alt);
      gk_set_decode_fusions(1);
      fx_run_chunks(m, tok, n, pat, other);
      gk_set_decode_fusions(-1);
      CHECK(memcmp(alt, other, (size_t)n * V * 4) == 0, "mode %d %s: the launch fusions change the logits", mode,
            q ? "chunks" : "decode");
    }
    printf("topk=%d kpool=%d %s: decode and chunks without / with the route, mHC pre, MLA store and KDA norm fusions "
           "bitwise identical\n", topk, kpool, mode ? "gemv" : "cublas");
  }
  gk_set_gemm_min(0);
  free(tok); free(cpu); free(full); free(other); free(alt);
  glm53_model_free(m);
}

/* w in bf16 (its values rounded) */
static void to_bf16(wmat *w) {
  const size_t n = (size_t)w->rows * w->cols;
  uint16_t *d = aligned_alloc64(n * 2);
  for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(((const float *)w->data)[i]);
  free(w->owned);
  w->fmt = WMAT_BF16; w->data = d; w->owned = d;
}
/* The side stream (gk_side_fork: the shared expert beside the routed
 * experts, the MLA queries beside the indexer, the KDA gate products beside
 * q / k / v and the recurrence) changes when work runs, never the bits:
 * prefills with it on and off, with bf16 experts so that the MoE takes its
 * sorted-GEMM path, bitwise equal. (Not against the CPU: that path rounds
 * the activations to bf16, which on this random 6-layer model flips
 * routings downstream, 0.35 relative on an H100; the oracle models of
 * test_gpu_golden check it against the reference.) */
static void check_side(uint64_t seed) {
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  glm53_model *m = fx_model(&c, seed);
  for (int l = 0; l < c.num_hidden_layers; l++)
    if (m->layers[l].mlp_kind == MLP_MOE) {
      moe_weights *e = &m->layers[l].moe;
      for (int i = 0; i < c.n_routed_experts; i++) to_bf16(&e->experts[i].gate), to_bf16(&e->experts[i].up), to_bf16(&e->experts[i].down);
      to_bf16(&e->shared.gate), to_bf16(&e->shared.up), to_bf16(&e->shared.down);
    }
  const int n = 61, V = c.vocab_size;
  int32_t *tok = xmalloc(n * sizeof(int32_t));
  trng r = {seed + 5};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
  float *on = xmalloc((size_t)n * V * 4), *off = xmalloc((size_t)n * V * 4);
  CHECK(glm53_backend_select(m, "gpu") == 0, "gpu backend: %s", glm53_last_error());
  if (!strcmp(glm53_model_backend(m), "gpu")) {
    const int pat[] = {40, 1, 0}; /* a 40-token prefill (side stream), then decode steps (none) */
    for (int q = 0; q < 2; q++) {
      gk_set_side(1);
      const unsigned f0 = gk_side_forks();
      fx_run_chunks(m, tok, n, q ? pat : (int[]){n, 0}, on);
      CHECK(gk_side_forks() > f0, "the side stream never forked (%s)", q ? "prefill + decode" : "prefill");
      gk_set_side(0);
      fx_run_chunks(m, tok, n, q ? pat : (int[]){n, 0}, off);
      gk_set_side(-1);
      printf("bf16 experts, %s: side stream on / off bitwise %s\n", q ? "prefill 40 + decode" : "prefill",
             memcmp(on, off, (size_t)n * V * 4) ? "NO" : "yes");
      CHECK(memcmp(on, off, (size_t)n * V * 4) == 0, "side stream on / off differ (%s)", q ? "prefill + decode" : "prefill");
    }
  }
  free(tok); free(on); free(off);
  glm53_model_free(m);
}

/* GPU prefill, a fault at the 3rd decode step, fallback, CPU from then on */
static void check_fallback(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  glm53_model *m = fx_model(&c, 9);
  const int n = 40, pre = 20, V = c.vocab_size;
  int32_t tok[40];
  trng r = {99};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
  float *ref = xmalloc((size_t)n * V * 4), *got = xmalloc((size_t)n * V * 4);
  fx_run_chunks(m, tok, n, (int[]){pre, 1, 0}, ref);
  CHECK(glm53_backend_select(m, "gpu") == 0, "%s", glm53_last_error());
  glm53_session *s = glm53_session_new(m, n);
  CHECK(!strcmp(glm53_session_backend(s), "gpu"), "session backend %s", glm53_session_backend(s));
  CHECK(glm53_forward(s, tok, pre, got, 1) == 0, "%s", glm53_last_error());
  setenv("GLM53_FAULT", "forward:3", 1);
  int faults = 0;
  for (int i = pre; i < n; i++) {
    if (glm53_forward(s, tok + i, 1, got + (size_t)i * V, 1)) {
      faults++;
      CHECK(strstr(glm53_last_error(), "injected") != NULL, "%s", glm53_last_error());
      CHECK(glm53_session_fallback_cpu(s) == 0, "%s", glm53_last_error());
      CHECK(glm53_forward(s, tok + i, 1, got + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
    }
  }
  unsetenv("GLM53_FAULT");
  CHECK(faults == 1, "expected one injected fault, saw %d", faults);
  CHECK(!strcmp(glm53_session_backend(s), "cpu"), "after fallback: %s", glm53_session_backend(s));
  float d = (float)rows_rel_diff(ref, got, pre + 2, V);
  CHECK(d <= 2e-4f, "gpu rows before the fault: %g", d);
  CHECK(memcmp(ref + (size_t)(pre + 2) * V, got + (size_t)(pre + 2) * V, (size_t)(n - pre - 2) * V * 4) == 0,
        "rows after the CPU fallback differ from a pure CPU run");
  glm53_session_free(s);
  free(ref); free(got);
  glm53_model_free(m);
}

/* A session whose context's cache pages do not fit the device is refused
 * at creation with the reason (the pages are reserved then), and the
 * model stays usable: a small session afterwards runs. */
static void check_reserve(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 0);
  glm53_model *m = fx_model(&c, 11);
  CHECK(glm53_backend_select(m, "gpu") == 0, "%s", glm53_last_error());
  glm53_session *big = glm53_session_new(m, 1 << 30); /* TBs of latent pages */
  CHECK(big == NULL || strcmp(glm53_session_backend(big), "gpu"), "a 2^30-token gpu session was created");
  if (!big) {
    CHECK(strstr(glm53_last_error(), "latent / indexer caches") != NULL, "refusal reason: %s", glm53_last_error());
    printf("2^30-token session refused at creation: %s\n", glm53_last_error());
  }
  glm53_session_free(big);
  glm53_session *s = glm53_session_new(m, 16);
  float *lg = xmalloc((size_t)c.vocab_size * 4);
  int32_t tok[4] = {1, 2, 3, 4};
  CHECK(s && glm53_forward(s, tok, 4, lg, 0) == 0, "a small session after the refusal: %s", glm53_last_error());
  glm53_session_free(s);
  free(lg);
  glm53_model_free(m);
}

int main(void) {
  if (gpu_test_skip()) return 0;
  check_model(64, 4, 0, 1); /* dense regime */
  /* the rest with 8-token cache pages (the default 256 holds these
   * contexts in one page): rows cross pages everywhere, and a layer's
   * pages interleave with the other layers' in the pool */
  setenv("GLM53_GPU_PAGE_TOKENS", "8", 1);
  setenv("GLM53_GPU_PAGE_RESERVE", "0", 1); /* and pages taken as positions are written (default: all at creation) */
  check_model(8, 4, 0, 2);  /* sparse */
  check_model(8, 2, 1, 3);  /* sparse, shared indexer layer */
  check_model(4, 1, 0, 4);  /* kpool 1 */
  check_model(12, 4, 1, 5);
  check_side(6);
  unsetenv("GLM53_GPU_PAGE_RESERVE");
  check_fallback();
  unsetenv("GLM53_GPU_PAGE_TOKENS"); /* 256-row pages: the 2^30-token tables stay small (32 MB each) */
  check_reserve();
  TEST_DONE();
}
