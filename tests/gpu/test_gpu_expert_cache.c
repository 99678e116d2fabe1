/* Routed-expert placement never changes results: logits with every expert
 * resident against a tiny VRAM budget (nothing resident: every expert is
 * streamed from host memory through the cache slots), a budget that keeps
 * some layers resident, and a single cache slot (eviction inside one layer
 * call), each with the look-ahead copies of the next layer's guessed
 * experts (every guess, or the default idle mode: one guess after a
 * copy-free layer call; and once without), on the fixture model and on models/tiny
 * (when present):
 *  - GEMV mode (GLM53_GPU_GEMM_MIN above every chunk): bitwise equal;
 *  - default mode (cuBLAS for chunks of >= 32 tokens, one GEMM per expert
 *    either way): max relative row difference <= 1e-6 (printed; expected 0);
 * prefill chunks and decode steps both; the cache statistics must show
 * copies while streaming, hits when the cache holds every streamed expert,
 * look-ahead copies with the default slots (twice top-k: one layer's
 * experts and the next's guessed ones) when every guess is copied, and none
 * when it is off. Everything three times, for each gk_set_shared_group
 * mode: the shared expert apart, its down product (and on models/tiny,
 * whose router is fp32 and experts Int4, its gate and up too) inside the
 * grouped launches, and all of its products inside (launches of their
 * own on layers with streamed experts). No device: SKIP. */
#include "glm53.h"
#include "gpu_test.h"
#include "gpu/kernels/gk.h"
#include "model_fixture.h"
#include "model/backend.h"
#include <stdlib.h>
#include <unistd.h>

typedef struct {
  const char *name;
  double gb;      /* load option */
  const char *slots; /* $GLM53_GPU_EXPERT_SLOTS or NULL */
  int expect_hits;   /* the cache holds every streamed expert */
  int lookahead;     /* glm53_gpu_set_expert_lookahead(GLM53_GPU_LA_*) */
  int expect_prefetch; /* look-ahead copies expected (free slots beyond one layer's experts) */
} placement;

/* ref: all resident; then each placement, both product modes */
static void compare(const char *what, glm53_model *(*load)(double gb, void *ctx), void *ctx, const placement *pl, int npl,
                    const int32_t *tok, int n) {
  static const int chunks[][4] = {{20, 1, 0}, {40, 5, 1, 0}};
  for (int mode = 0; mode < 2; mode++) {
    gk_set_gemm_min(mode ? 1 << 30 : 0); /* 1: GEMV everywhere */
    unsetenv("GLM53_GPU_EXPERT_SLOTS");
    glm53_model *ref = load(-1, ctx);
    CHECK(ref != NULL, "%s: load: %s", what, glm53_last_error());
    if (!ref) return;
    glm53_gpu_expert_stats st;
    CHECK(glm53_gpu_expert_stats_get(ref, &st) == 0 && !st.streaming, "%s: reference should have every expert resident", what);
    const int V = glm53_model_vocab_size(ref);
    float *a = xmalloc((size_t)n * V * 4), *b = xmalloc((size_t)n * V * 4);
    for (int p = 0; p < npl; p++) {
      if (pl[p].slots) setenv("GLM53_GPU_EXPERT_SLOTS", pl[p].slots, 1);
      else unsetenv("GLM53_GPU_EXPERT_SLOTS");
      glm53_gpu_set_expert_lookahead(pl[p].lookahead);
      glm53_model *m = load(pl[p].gb, ctx);
      CHECK(m != NULL, "%s %s: load: %s", what, pl[p].name, glm53_last_error());
      if (!m) continue;
      CHECK(glm53_gpu_expert_stats_get(m, &st) == 0 && st.streaming, "%s %s: expected streamed experts", what, pl[p].name);
      for (size_t ch = 0; ch < sizeof chunks / sizeof *chunks; ch++) {
        fx_run_chunks(ref, tok, n, chunks[ch], a);
        glm53_gpu_expert_stats_reset(m);
        fx_run_chunks(m, tok, n, chunks[ch], b);
        glm53_gpu_expert_stats_get(m, &st);
        double d = rows_rel_diff(a, b, n, V);
        int same = memcmp(a, b, (size_t)n * V * 4) == 0;
        unsigned long long u = st.hits + st.misses;
        printf("%s %-26s %s chunks %zu: %ld resident / %ld streamed, %d slots; hits %llu misses %llu (%.0f%%), "
               "look-ahead %llu (%llu used), %.3f MB copied; max rel diff %.3g%s\n",
               what, pl[p].name, mode ? "gemv  " : "cublas", ch, st.resident, st.streamed, st.slots, st.hits, st.misses,
               u ? 100.0 * st.hits / u : 0.0, st.prefetches, st.prefetch_hits, st.bytes_h2d / 1e6, d,
               same ? " (bitwise equal)" : "");
        if (mode) CHECK(same, "%s %s chunks %zu: gemv mode differs (%g)", what, pl[p].name, ch, d);
        else CHECK(d <= 1e-6, "%s %s chunks %zu: %g", what, pl[p].name, ch, d);
        /* a cache that holds every streamed expert is warm after the first pattern */
        CHECK(st.bytes_h2d > 0 || (pl[p].expect_hits && ch > 0), "%s %s: no expert was copied", what, pl[p].name);
        if (pl[p].expect_hits) CHECK(st.hits > 0, "%s %s: no cache hit", what, pl[p].name);
        CHECK(st.prefetch_hits <= st.prefetches, "%s %s: more look-ahead hits than copies", what, pl[p].name);
        if (pl[p].lookahead == GLM53_GPU_LA_OFF) CHECK(st.prefetches == 0, "%s %s: look-ahead copies while off", what, pl[p].name);
        if (pl[p].expect_prefetch) CHECK(st.prefetches > 0, "%s %s: no look-ahead copy", what, pl[p].name);
      }
      glm53_model_free(m);
    }
    unsetenv("GLM53_GPU_EXPERT_SLOTS");
    glm53_gpu_set_expert_lookahead(-1);
    free(a); free(b);
    glm53_model_free(ref);
  }
  gk_set_gemm_min(0);
}

static glm53_model *load_fixture(double gb, void *ctx) {
  const glm53_config *c = ctx;
  glm53_model *m = fx_model(c, 7);
  m->gpu_expert_gb = gb;
  if (glm53_backend_select(m, "gpu")) { glm53_model_free(m); return NULL; }
  return m;
}

static glm53_model *load_tiny(double gb, void *ctx) {
  glm53_load_opts o = {.backend = "gpu", .gpu_expert_gb = gb};
  return glm53_model_load(ctx, &o);
}

int main(void) {
  if (gpu_test_skip()) return 0;
  unsetenv("GLM53_GPU_EXPERT_GB");
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  /* fixture experts: f32 16x32, 16x32, 32x16 -> 3 x 2 KB blobs; 8 per MoE layer */
  const double blob = 6.0 * 1024 / 1e9;
  const placement pl[] = {
      {"nothing resident", 1e-12, NULL, 0, GLM53_GPU_LA_ALL, 1},
      {"nothing resident, idle look-ahead", 1e-12, NULL, 0, GLM53_GPU_LA_IDLE, 0},
      {"nothing resident, no look-ahead", 1e-12, NULL, 0, GLM53_GPU_LA_OFF, 0},
      {"two layers resident", blob * (16 + 4), "4", 0, GLM53_GPU_LA_ALL, 0},
      {"one slot", 1e-12, "1", 0, GLM53_GPU_LA_ALL, 0},
      {"cache holds all", 1e-12, "32", 1, GLM53_GPU_LA_IDLE, 0},
  };
  const int n = 48;
  int32_t tok[48];
  trng r = {1234};
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % (uint64_t)c.vocab_size);
  const char *tiny = "models/tiny";
  int32_t ttok[48];
  int have_tiny = 0;
  if (access("models/tiny/config.json", R_OK) == 0) {
    glm53_model *probe = glm53_model_load(tiny, &(glm53_load_opts){.backend = "cpu"});
    CHECK(probe != NULL, "models/tiny: %s", glm53_last_error());
    if (probe) {
      int V = glm53_model_vocab_size(probe);
      glm53_model_free(probe);
      for (int i = 0; i < n; i++) ttok[i] = (int32_t)(trng_u64(&r) % (uint64_t)V);
      have_tiny = 1;
    }
  } else
    printf("models/tiny not present: fixture only\n");
  const placement pt[] = {{"nothing resident", 1e-12, NULL, 0, GLM53_GPU_LA_ALL, 0},
                          {"nothing resident, idle look-ahead", 1e-12, NULL, 0, GLM53_GPU_LA_IDLE, 0},
                          {"one slot", 1e-12, "1", 0, GLM53_GPU_LA_ALL, 0}};
  static const char *const fxn[] = {"fixture", "fixture+sg1", "fixture+sg2"}, *const tyn[] = {"tiny", "tiny+sg1", "tiny+sg2"};
  for (int sg = 0; sg < 3; sg++) {
    gk_set_shared_group(sg);
    printf("-- shared expert: gk_set_shared_group(%d)\n", sg);
    compare(fxn[sg], load_fixture, &c, pl, (int)(sizeof pl / sizeof *pl), tok, n);
    if (have_tiny) compare(tyn[sg], load_tiny, (void *)tiny, pt, 3, ttok, n);
  }
  gk_set_shared_group(-1);
  TEST_DONE();
}
