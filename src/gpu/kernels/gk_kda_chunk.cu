/* KDA recurrence in the chunked form for long prefill chunks (docs/gpu.md,
 * "KDA chunked prefill"): the math of src/model/kda.c kda_one_chunk, split
 * into a kernel that is parallel over (chunk, head) and a pass that walks
 * the chunks of a sequence in order. The token kernel (kda_recur_k) does
 * ~4 dependent steps per token per head; here the sequential part is one
 * step per KC tokens, as small matrix products.
 *
 * Per chunk of n <= KC tokens of one head, G = cumulative log decay from
 * the chunk start (inclusive), every exponent a difference G_r - G_s with
 * s <= r (<= 0: nothing overflows):
 *   prep (kda_chunk_prep_k, one block per chunk and head):
 *     M[r][s]   = beta_r sum_i k_ri k_si exp(G_ri - G_si)       s < r
 *     Aqk[r][s] = sum_i q_ri k_si exp(G_ri - G_si)              s <= r
 *     U = (I + M)^-1 (beta v), W = (I + M)^-1 (beta k exp(G))   forward substitution
 *     qg = q exp(G), kd = k exp(G_last - G), gl = exp(G_last)
 *   pass (kda_chunk_pass_k, one block per head and 32 value columns):
 *     V' = U - W S;  o = qg S + Aqk V';  S = gl S + kd^T V'
 * Everything is fp32 (the CPU form accumulates in double); the result
 * equals the token recurrence to fp32 rounding, not bitwise. Opt-in
 * (GLM53_KDA_PREFILL=chunked, as on the CPU): on the H200 it is slower
 * than the token kernel as written (4096-token prefill 539.6 vs 506.4 ms;
 * prep 53 + pass 62 ms over 34 layers), see docs/gpu.md.
 *
 * In place: qg over q, kd over k, U over v (the conv output qkv, dead after
 * the recurrence), W over the raw gate projection; Aqk and gl go to a
 * caller's work area (the forward passes the layer's projection buffer,
 * dead after the conv). */
#include "gk_common.cuh"
#include "gk_kda_chunk.cuh"
#include <stdlib.h>
#include <string.h>

/* ---- host side ---- */
static int g_kc_mode = -1; /* -1: GLM53_KDA_PREFILL (as on the CPU) */
extern "C" void gk_set_kda_chunked(int on) { g_kc_mode = on < 0 ? -1 : !!on; }
static int kc_mode(void) {
  if (g_kc_mode < 0) {
    const char *e = getenv("GLM53_KDA_PREFILL");
    g_kc_mode = e && !strcmp(e, "chunked");
  }
  return g_kc_mode;
}
/* each instantiation's dynamic shared memory opt-in, once (false: the
 * device cannot give it, e.g. 64 KB of LDS: the token form instead) */
template <int HD, int KC> static bool kc_smem(void) {
  static int ok = -1;
  if (ok < 0) {
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    ok = cudaFuncSetAttribute((const void *)kda_chunk_prep_k<HD, KC, false>, a,
                              (int)(kc_prep_floats<HD, KC, false>() * sizeof(float))) == cudaSuccess &&
         cudaFuncSetAttribute((const void *)kda_chunk_prep_k<HD, KC, true>, a,
                              (int)(kc_prep_floats<HD, KC, true>() * sizeof(float))) == cudaSuccess &&
         cudaFuncSetAttribute((const void *)kda_chunk_pass_k<HD, KC>, a,
                              (int)(kc_pass_floats<HD, KC>() * sizeof(float))) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
  }
  return ok;
}
/* the prep's pair products: factorised (default where the gate's lower
 * bound allows) or one exponential per pair and channel
 * (GLM53_GPU_KDA_PAIRS=exact, gk_set_kda_pairs(0)) */
static int g_kc_fact = -1;
extern "C" void gk_set_kda_pairs(int fact) { g_kc_fact = fact < 0 ? -1 : !!fact; }
static bool kc_fact(float lb) {
  if (g_kc_fact < 0) {
    const char *e = getenv("GLM53_GPU_KDA_PAIRS");
    g_kc_fact = !(e && !strcmp(e, "exact"));
  }
  return g_kc_fact && lb >= -KC_FACT_LB && lb <= 0.f; /* false for NaN (no bound) */
}
/* tokens per chunk, 64 (default) or 32 (GLM53_GPU_KDA_CHUNK, gk_set_kda_chunk_len):
 * 32 halves the prep's pair products per token, doubles the pass's steps */
static int g_kc_len;
extern "C" void gk_set_kda_chunk_len(int len) { g_kc_len = len == 32 || len == 64 ? len : 0; }
static int kc_len(void) {
  if (!g_kc_len) {
    const char *e = getenv("GLM53_GPU_KDA_CHUNK");
    g_kc_len = e && atoi(e) == 32 ? 32 : 64;
  }
  return g_kc_len;
}
template <int KC> static bool kc_hd_ok_c(int hd) {
  switch (hd) {
  case 32: return kc_smem<32, KC>();
  case 64: return kc_smem<64, KC>();
  case 128: return kc_smem<128, KC>();
  default: return false;
  }
}
static bool kc_hd_ok(int hd) { return kc_len() == 32 ? kc_hd_ok_c<32>(hd) : kc_hd_ok_c<64>(hd); }
extern "C" int gk_kda_chunk_use(const gk_batch *b, int hd) { return kc_mode() && b->maxlen >= KC_MIN && kc_hd_ok(hd); }
/* for either chunk length (64 + hd per token and head at most) */
extern "C" size_t gk_kda_chunk_work(int T, int H, int hd) { return (size_t)T * H * (64 + hd); }

/* two checks: the kernel profile (gk_kprof) times prep and pass apart */
template <int HD, int KC>
static int kc_launch(const gk_batch *b, float *qkv, float *graw, const float *dt_bias, const float *A_log, float lb,
                     const float *bl, int T, int H, float *work, float *o) {
  float *aqk = work, *glb = work + (size_t)T * H * KC;
  const dim3 grid((b->maxlen + KC - 1) / KC, H, b->nseg);
  if (kc_fact(lb))
    gk_launch(kda_chunk_prep_k<HD, KC, true>, grid, KCT, kc_prep_floats<HD, KC, true>() * sizeof(float), *b, qkv, graw,
              dt_bias, A_log, lb, bl, H, aqk, glb);
  else
    gk_launch(kda_chunk_prep_k<HD, KC, false>, grid, KCT, kc_prep_floats<HD, KC, false>() * sizeof(float), *b, qkv, graw,
              dt_bias, A_log, lb, bl, H, aqk, glb);
  if (GK_LAUNCHED("kda_chunk_prep")) return -1;
  gk_launch(kda_chunk_pass_k<HD, KC>, dim3(H, HD / KCB, b->nseg), KCT, kc_pass_floats<HD, KC>() * sizeof(float), *b,
            (const float *)qkv, (const float *)graw, (const float *)aqk, (const float *)glb, H, o);
  return GK_LAUNCHED("kda_chunk_pass");
}
extern "C" int gk_kda_chunked(const gk_batch *b, float *qkv, float *graw, const float *dt_bias, const float *A_log,
                              float lower_bound, const float *beta_logit, int T, int H, int hd, float *work, float *o) {
  if (b->nseg < 1 || b->nseg > 65535 || b->maxlen < 1 || b->maxlen > T)
    return gk_fail("kda_chunked: bad batch (%d segments, longest %d, %d tokens)", b->nseg, b->maxlen, T);
  if (!kc_hd_ok(hd)) return gk_fail("kda_chunked: head dim %d not supported (32, 64, 128 with 90 KB of shared memory)", hd);
  if ((uintptr_t)qkv % 16 || (uintptr_t)graw % 16) return gk_fail("kda_chunked: qkv / gate rows not 16-byte aligned");
#define KC_CASE(HD)                                                                                      \
  return kc_len() == 32 ? kc_launch<HD, 32>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, T, H, work, o) \
                        : kc_launch<HD, 64>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, T, H, work, o)
  switch (hd) {
  case 32: KC_CASE(32);
  case 64: KC_CASE(64);
  default: KC_CASE(128);
  }
#undef KC_CASE
}
