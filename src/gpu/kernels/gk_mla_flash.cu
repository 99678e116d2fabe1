/* Fused (flash) attention of the per-head MLA form (gk_mla_mha_gemm): one
 * kernel streams each head's keys and values through shared memory and
 * keeps the scores and probabilities in registers (an online softmax, as
 * FlashAttention-2 does), instead of writing every score to memory, reading
 * it back for the softmax and reading the probabilities again for the
 * output GEMMs (~12 bytes of traffic per (token, head, row)).
 *
 * Arithmetic: the same terms as the GEMM form, on bf16 tensor cores
 * (mma.sync m16n8k16, fp32 accumulation): scores = q (bf16) . (K hi + K lo),
 * output = P hi . V hi + P lo . V hi + P hi . V lo (the probabilities split
 * hi + lo, lo.lo dropped). The softmax is online (a running max and sum
 * per row, rescaled per key tile), so the sums run in another order than
 * the GEMM form's: equal within rounding, not bitwise.
 *
 * Layout: a block of 8 warps takes 64 tokens of one head: 4 row groups of
 * 16, two warps each, one for each half of a key tile's scores and of the
 * output columns (so a warp holds 128 output columns, not 256: <= 128
 * registers, two blocks per SM with 32-key tiles; the first kernel, 4
 * warps with all 256 columns each, ran one block of 4 warps per SM and
 * measured 96 ms per 4096-token prefill, latency-bound). The two warps
 * of a group exchange row maxima and probabilities through shared memory.
 * Key tiles of BN rows (K hi|lo, V hi|lo from the KV3 rows of the GEMM
 * form) go through shared memory by cp.async, the next K tile loading
 * while the output products of this one run and the V tile while its
 * scores run; rows padded by 16 bytes so ldmatrix reads are conflict-free.
 * Key tiles past the block's last position are skipped; inside, the
 * selection mask of the GEMM form's softmax applies per (token, row):
 * n <= pos, and for a token past the dense prefix n >= tail or n's pool in
 * the token's selection (a bitmap per token, built here). The longest
 * (last) token tiles start first. CUDA only (mma.sync, ldmatrix, cp.async):
 * 1 elsewhere, and the GEMM form runs. */
#include "gk_common.cuh"
#include <stdlib.h>
#include <string.h>

#if !GK_HIP
#include "gk_mla_flash.cuh"

template <int NOPE, int VD, int BN>
static int mf_run(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *tail, const uint32_t *map, int nw,
                  const int *dpos, int T, int H, int pshift, int lrows, float sl2, float *out) {
  using C = mf_cfg<NOPE, VD, BN>;
  static int attr;
  if (!attr) { /* more than the 48 KB default of dynamic shared memory */
    GK_TRY(cudaFuncSetAttribute((const void *)mla_flash_k<NOPE, VD, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)C::smem));
    attr = 1;
  }
  gk_launch(mla_flash_k<NOPE, VD, BN>, dim3((T + MF_BM - 1) / MF_BM, H), MF_THREADS, C::smem, Q16, KV3, dense, tail, map, nw, dpos,
            T, H, pshift, lrows, sl2, out);
  return GK_LAUNCHED("mla flash") ? -1 : 0;
}
#endif

static int g_flash = -1; /* GLM53_GPU_MLA_FLASH=0: the GEMM form */
static int g_flash_bn = -1; /* GLM53_GPU_MLA_FLASH_BN: keys per tile, 32 or 64 */
extern "C" void gk_set_mla_flash_bn(int bn) { g_flash_bn = bn == 32 || bn == 64 ? bn : -1; }
extern "C" int gk_mla_flash_bn(void) {
  if (g_flash_bn < 0) {
    const char *e = getenv("GLM53_GPU_MLA_FLASH_BN");
    g_flash_bn = e && atoi(e) == 64 ? 64 : 32;
  }
  return g_flash_bn;
}
extern "C" void gk_set_mla_flash(int on) { g_flash = on < 0 ? -1 : !!on; }
extern "C" int gk_mla_flash_on(void) {
  if (g_flash < 0) g_flash = !(getenv("GLM53_GPU_MLA_FLASH") && !strcmp(getenv("GLM53_GPU_MLA_FLASH"), "0"));
  return g_flash;
}

int gk_mla_flash(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *npools, const int *tail,
                 const int *pools, int K, const int *dpos, int T, int H, int nope, int vd, int P, int lrows, float scale,
                 uint32_t *map, float *out) {
#if GK_HIP
  (void)Q16; (void)KV3; (void)dense; (void)npools; (void)tail; (void)pools; (void)K; (void)dpos; (void)T; (void)H;
  (void)nope; (void)vd; (void)P; (void)lrows; (void)scale; (void)map; (void)out;
  return 1;
#else
  if (!gk_mla_flash_fits(nope, vd, P)) return 1;
  int pshift = 0;
  while ((1 << pshift) < P) pshift++;
  const int nw = mf_map_words(lrows, P);
  gk_launch(mf_selmap_k, dim3(T), 256, (size_t)nw * 4, dense, npools, pools, K, nw, map);
  if (GK_LAUNCHED("mla flash selection map")) return -1;
  const float sl2 = scale * 1.4426950408889634f;
#define MF_RUN(N, V, B) mf_run<N, V, B>(Q16, KV3, dense, tail, map, nw, dpos, T, H, pshift, lrows, sl2, out)
  const int bn = gk_mla_flash_bn();
  if (nope == 256) return bn == 32 ? MF_RUN(256, 256, 32) : MF_RUN(256, 256, 64);
  return bn == 32 ? MF_RUN(64, 32, 32) : MF_RUN(64, 32, 64);
#undef MF_RUN
#endif
}

int gk_mla_flash_map_words(int lrows, int P) {
#if GK_HIP
  (void)lrows; (void)P;
  return 0; /* no fused kernel */
#else
  return mf_map_words(lrows, P);
#endif
}
/* the widths compiled (the model's 256 / 256, and 64 / 32 for tests), pools of a power-of-two size */
extern "C" int gk_mla_flash_fits(int nope, int vd, int P) {
  return !GK_HIP && gk_mla_flash_on() && P > 0 && !(P & (P - 1)) && ((nope == 256 && vd == 256) || (nope == 64 && vd == 32));
}
