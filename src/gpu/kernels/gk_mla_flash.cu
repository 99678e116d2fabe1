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
#include "gk_wgmma.cuh"
#include "gk_mla_flash_wg.cuh"

template <int NOPE, int VD, int BN>
static int mf_run(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *tail, const uint32_t *map, int nw,
                  const int *dpos, int T, int H, int pshift, int lrows, float sl2, void *out, int out16) {
  using C = mf_cfg<NOPE, VD, BN>;
  static int attr;
  if (!attr) { /* more than the 48 KB default of dynamic shared memory */
    GK_TRY(cudaFuncSetAttribute((const void *)mla_flash_k<NOPE, VD, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)C::smem));
    attr = 1;
  }
  gk_launch(mla_flash_k<NOPE, VD, BN>, dim3((T + MF_BM - 1) / MF_BM, H), MF_THREADS, C::smem, Q16, KV3, dense, tail, map, nw, dpos,
            T, H, pshift, lrows, sl2, out, out16);
  return GK_LAUNCHED("mla flash") ? -1 : 0;
}

template <int NOPE, int VD, int DG = 0, int BN = 64>
static int mw_run(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *tail, const uint32_t *map, int nw,
                  const int *dpos, int T, int H, int pshift, int lrows, float sl2, void *out, int out16) {
  using C = mw_cfg<NOPE, VD, BN>;
  static int attr;
  if (!attr) {
    GK_TRY(cudaFuncSetAttribute((const void *)mla_flash_wg_k<NOPE, VD, DG, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)C::smem));
    attr = 1;
  }
  const int hg = H % gk_mla_flash_wg_hg() ? 1 : gk_mla_flash_wg_hg();
  gk_launch(mla_flash_wg_k<NOPE, VD, DG, BN>, dim3((T + MW_BM - 1) / MW_BM * H), MW_THREADS, C::smem, Q16, KV3, dense, tail,
            map, nw, dpos, T, H, pshift, lrows, sl2, hg, out, out16);
  return GK_LAUNCHED("mla flash (wgmma)") ? -1 : 0;
}

/* The two product forms of the kernel alone, for tests/gpu: D1 [64 x 64] =
 * A . B and D2 [64 x 32] = A . B[:, :32] (A [64 x 16], B [16 x 64] bf16,
 * row-major), D1 with both operands K-major in shared memory (the scores),
 * D2 with A in registers and B MN-major (the output products). mode 0: the
 * no-swizzle layout; 1: the same with the descriptors' LBO and SBO
 * exchanged (a diagnostic: the results are then expected to be wrong); 2:
 * the 128-byte swizzle as the fused kernel uses it, starts inside the
 * atoms' rows (A and B^T at their k step 2, 32 bytes in; B's columns at
 * column 32, 64 bytes in, as V lo at VD 32). */
__global__ void mw_check_k(const uint16_t *A, const uint16_t *B, float *D1, float *D2, int mode) {
#if MW_WGMMA
  __shared__ __align__(1024) uint16_t As[64 * 64], Bk[64 * 64], Bm[16 * 64];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3, sw = mode == 2;
  for (int i = tid; i < 64 * 16; i += 128) {
    const int r = i / 16, k = i % 16; /* K-major: rows r (of A; of B^T: n); else 8 x 16-byte core matrices, LBO 128, SBO 256 */
    const int o = sw ? (int)(mw_sw128_off(2 + k / 8, r, 64) + (k % 8) * 2)
                     : (r / 8) * 256 + (r % 8) * 16 + (k / 8) * 128 + (k % 8) * 2;
    As[o / 2] = A[i];
    Bk[o / 2] = B[k * 64 + r];
  }
  for (int i = tid; i < 16 * 32; i += 128) { /* MN-major: (k, n); else LBO 128 (8 k), SBO 256 (8 n) */
    const int k = i / 32, n = i % 32;
    const int o = sw ? (int)(mw_sw128_off(4 + n / 8, k, 16) + (n % 8) * 2)
                     : (n / 8) * 256 + (n % 8) * 2 + (k / 8) * 128 + (k % 8) * 16;
    Bm[o / 2] = B[k * 64 + n];
  }
  mw_proxy_fence();
  __syncthreads();
  float d1[32], d2[16];
  for (int i = 0; i < 32; i++) d1[i] = 0.f;
  for (int i = 0; i < 16; i++) d2[i] = 0.f;
  const int r0 = 16 * w + g;
  uint32_t a[4];
  for (int q = 0; q < 4; q++) { /* the mma.sync A fragment of rows r0, r0 + 8 */
    const int r = r0 + 8 * (q & 1), k = 2 * t4 + 8 * (q >> 1);
    a[q] = (uint32_t)A[r * 16 + k] | (uint32_t)A[r * 16 + k + 1] << 16;
  }
  const uint32_t lbo = mode == 1 ? 256 : 128, sbo = mode == 1 ? 128 : 256;
  mw_fence();
  if (sw) {
    mw_ss_n64(d1, mw_desc_sw128((char *)As + 32, 16, 1024), mw_desc_sw128((char *)Bk + 32, 16, 1024), 0);
    mw_rs_n32(d2, a, mw_desc_sw128((char *)Bm + 64, 16 * 128, 1024));
  } else {
    mw_ss_n64(d1, mw_desc(As, lbo, sbo), mw_desc(Bk, lbo, sbo), 0);
    mw_rs_n32(d2, a, mw_desc(Bm, lbo, sbo));
  }
  mw_commit();
  mw_wait0();
  for (int i = 0; i < 32; i++) mw_keep(d1[i]);
  for (int i = 0; i < 16; i++) mw_keep(d2[i]);
  for (int i = 0; i < 8; i++)
    for (int e = 0; e < 4; e++) {
      const int r = r0 + 8 * (e >> 1), n = 8 * i + 2 * t4 + (e & 1);
      D1[r * 64 + n] = d1[4 * i + e];
      if (i < 4) D2[r * 32 + n] = d2[4 * i + e];
    }
#else
  (void)A; (void)B; (void)D1; (void)D2; (void)mode;
#endif
}

/* whether this module's device code has the wgmma instructions (sm_90a):
 * the runtime picked one image of the module for the device, and this
 * kernel reports which */
__global__ void mw_probe_k(int *has) { *has = MW_WGMMA; }
#endif

static int g_wg_avail; /* the warpgroup kernel can run on this device (gk_mla_flash_wg_detect) */
static int g_wg = -1;  /* GLM53_GPU_MLA_FLASH_WG=0: the mma.sync kernel */
extern "C" int gk_mla_flash_wg_detect(int cc_major, int cc_minor) {
  g_wg_avail = 0;
#if !GK_HIP
  if (cc_major != 9 || cc_minor != 0) return 0; /* wgmma is Hopper's (sm_90a code runs on 9.0 only) */
  int *d = NULL, has = 0;
  if (cudaMalloc((void **)&d, sizeof(int)) != cudaSuccess) return gk_fail("mla flash probe: %s", cudaGetErrorString(cudaGetLastError()));
  mw_probe_k<<<1, 1>>>(d);
  cudaError_t e = cudaMemcpy(&has, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) return gk_fail("mla flash probe: %s", cudaGetErrorString(e));
  g_wg_avail = has;
#else
  (void)cc_major; (void)cc_minor;
#endif
  return 0;
}
extern "C" int gk_wgmma_check(const uint16_t *A, const uint16_t *B, float *D1, float *D2, int mode) {
#if !GK_HIP
  if (!g_wg_avail) return 1;
  mw_check_k<<<1, 128>>>(A, B, D1, D2, mode);
  return GK_LAUNCHED("wgmma check") ? -1 : 0;
#else
  (void)A; (void)B; (void)D1; (void)D2; (void)mode;
  return 1;
#endif
}
extern "C" void gk_set_mla_flash_wg(int on) { g_wg = on < 0 ? -1 : !!on; }
static int g_wg_hg = -1; /* GLM53_GPU_MLA_FLASH_HG: heads per block group (mla_flash_wg_k's order) */
extern "C" void gk_set_mla_flash_wg_hg(int hg) { g_wg_hg = hg > 0 ? hg : -1; }
extern "C" int gk_mla_flash_wg_hg(void) {
  if (g_wg_hg < 0) {
    const char *e = getenv("GLM53_GPU_MLA_FLASH_HG");
    /* default 4: 3.10 ms per gpu_mla call on an H100 against 3.34 with 1 (fourteenth session) */
    g_wg_hg = e && atoi(e) > 0 ? atoi(e) : 4;
  }
  return g_wg_hg;
}
static int g_wg_bn = -1; /* GLM53_GPU_MLA_FLASH_WG_BN: keys per tile, 64 (one stage) or 32 (two stages) */
extern "C" void gk_set_mla_flash_wg_bn(int bn) { g_wg_bn = bn == 32 || bn == 64 ? bn : -1; }
extern "C" int gk_mla_flash_wg_bn(void) {
  if (g_wg_bn < 0) {
    const char *e = getenv("GLM53_GPU_MLA_FLASH_WG_BN");
    g_wg_bn = e && atoi(e) == 32 ? 32 : 64;
  }
  return g_wg_bn;
}
static int g_wg_diag; /* gk_set_mla_flash_wg_diag: MW_DG_* bits (bench only) */
extern "C" int gk_set_mla_flash_wg_diag(int dg) {
  /* the instantiations in gk_mla_flash: 64 keys per tile, 32 */
  static const int have[] = {0, 1, 2, 4, 6, 8, 9, 14, 15, 16}, have32[] = {0, 1, 9, 14};
  const int n32 = gk_mla_flash_wg_bn() == 32;
  const int *h = n32 ? have32 : have, nh = n32 ? (int)(sizeof have32 / sizeof *have32) : (int)(sizeof have / sizeof *have);
  for (int i = 0; i < nh; i++)
    if (h[i] == dg) return g_wg_diag = dg, 0;
  return -1;
}
extern "C" int gk_mla_flash_wg(void) {
  if (g_wg < 0) g_wg = !(getenv("GLM53_GPU_MLA_FLASH_WG") && !strcmp(getenv("GLM53_GPU_MLA_FLASH_WG"), "0"));
  return g_wg && g_wg_avail;
}

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
  return gk_mla_flash_out(Q16, KV3, dense, npools, tail, pools, K, dpos, T, H, nope, vd, P, lrows, scale, map, out, 0);
}
int gk_mla_flash_out(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *npools, const int *tail,
                     const int *pools, int K, const int *dpos, int T, int H, int nope, int vd, int P, int lrows, float scale,
                     uint32_t *map, void *out, int out16) {
#if GK_HIP
  (void)Q16; (void)KV3; (void)dense; (void)npools; (void)tail; (void)pools; (void)K; (void)dpos; (void)T; (void)H;
  (void)nope; (void)vd; (void)P; (void)lrows; (void)scale; (void)map; (void)out; (void)out16;
  return 1;
#else
  if (!gk_mla_flash_fits(nope, vd, P)) return 1;
  int pshift = 0;
  while ((1 << pshift) < P) pshift++;
  const int nw = mf_map_words(lrows, P);
  gk_launch(mf_selmap_k, dim3(T), 256, (size_t)nw * 4, dense, npools, pools, K, nw, map);
  if (GK_LAUNCHED("mla flash selection map")) return -1;
  const float sl2 = scale * 1.4426950408889634f;
#define MF_RUN(N, V, B) mf_run<N, V, B>(Q16, KV3, dense, tail, map, nw, dpos, T, H, pshift, lrows, sl2, out, out16)
#define MW_RUN(N, V, D) mw_run<N, V, D>(Q16, KV3, dense, tail, map, nw, dpos, T, H, pshift, lrows, sl2, out, out16)
#define MW_RUN2(N, V, D) mw_run<N, V, D, 32>(Q16, KV3, dense, tail, map, nw, dpos, T, H, pshift, lrows, sl2, out, out16)
  const int two = gk_mla_flash_wg_bn() == 32; /* 32 keys per tile in two stages */
  if (gk_mla_flash_wg() && nope == 256 && g_wg_diag && two) switch (g_wg_diag) { /* timing diagnostics (bench) */
    case 1: return MW_RUN2(256, 256, 1);
    case 9: return MW_RUN2(256, 256, 9);
    default: return MW_RUN2(256, 256, 14);
    }
  if (gk_mla_flash_wg() && nope == 256 && g_wg_diag) switch (g_wg_diag) { /* timing diagnostics (bench) */
    case 1: return MW_RUN(256, 256, 1);
    case 2: return MW_RUN(256, 256, 2);
    case 4: return MW_RUN(256, 256, 4);
    case 6: return MW_RUN(256, 256, 6);
    case 8: return MW_RUN(256, 256, 8);
    case 9: return MW_RUN(256, 256, 9);
    case 14: return MW_RUN(256, 256, 14);
    case 16: return MW_RUN(256, 256, 16);
    default: return MW_RUN(256, 256, 15);
    }
  if (gk_mla_flash_wg() && two) return nope == 256 ? MW_RUN2(256, 256, 0) : MW_RUN2(64, 32, 0);
  if (gk_mla_flash_wg()) return nope == 256 ? MW_RUN(256, 256, 0) : MW_RUN(64, 32, 0);
  const int bn = gk_mla_flash_bn();
  if (nope == 256) return bn == 32 ? MF_RUN(256, 256, 32) : MF_RUN(256, 256, 64);
  return bn == 32 ? MF_RUN(64, 32, 32) : MF_RUN(64, 32, 64);
#undef MF_RUN
#undef MW_RUN
#undef MW_RUN2
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
