/* The fused (flash) attention kernels of the per-head MLA form
 * (src/gpu/kernels/gk_mla_flash.cuh on mma.sync, gk_mla_flash_wg.cuh on
 * wgmma) and their selection bitmap run on the host through the CUDA
 * emulator (tests/emu/cuda_emu.h emulates the warp's ldmatrix and bf16
 * mma.sync, and the warpgroup's wgmma from its shared-memory descriptors
 * as the PTX ISA defines the 128-byte swizzled layout the kernel uses;
 * that the device reads them so is checked by test_gpu_kernels' wgmma
 * check, mode 2), against a float64 softmax attention over
 * the same bf16 inputs (q, K hi + lo, V hi + lo) and the same selections
 * written as explicit row lists: dense tokens, then K pools (a spread,
 * unordered choice) plus the tail. Rows past the context hold large values
 * that must stay masked; a partial last block of tokens; a later chunk
 * (pos0 > 0) over several key tiles; the model's widths (256 / 256) and the
 * small test widths (64 / 32). Tolerance 1e-4 of each token-head's largest
 * output (the kernel splits the probabilities into bf16 hi + lo and drops
 * lo x lo: ~2^-16 relative). So the fragment layouts and the masking are
 * checked on every CI run, not only on a device. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
}
#include "test_util.h"
#include <string.h>

#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_mla_flash.cuh"
#include "gpu/kernels/gk_wgmma.cuh"
#include "gpu/kernels/gk_mla_flash_wg.cuh"

static uint64_t g_s = 0x13198a2e03707344ull;
static uint64_t rnd() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return g_s;
}
static float rf() { return (float)((rnd() >> 11) * (2.0 / 9007199254740992.0) - 1.0); }
static float bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* BN 32 or 64: mla_flash_k with that many keys per tile; BN 0: the
 * warpgroup kernel mla_flash_wg_k (WBN keys per tile: 64 in one stage, 32
 * in two; 128 tokens per block; its blocks in groups of hg heads). o16:
 * also the bf16 output rows, which must be the fp32 output's rounding. */
template <int NOPE, int VD, int BN, int DG = 0, int WBN = 64>
static void flash_case(int H, int P, int K, int pos0, int T, int hg = 1, bool o16 = false) {
  const int ctx = pos0 + T, lrows = (ctx + 7) / 8 * 8, ldh = 2 * (NOPE + VD);
  int pshift = 0;
  while ((1 << pshift) < P) pshift++;
  /* inputs as the GEMM form leaves them: q rounded to bf16; K and V split
   * hi + lo; rows past the context (up to lrows) large, to be masked */
  std::vector<uint16_t> q16((size_t)T * H * NOPE), kv((size_t)lrows * H * ldh);
  for (auto &x : q16) x = (uint16_t)bf16_bits(rf());
  for (int n = 0; n < lrows; n++)
    for (int h = 0; h < H; h++)
      for (int part = 0; part < 2; part++) { /* K, V */
        const int w = part ? VD : NOPE;
        uint16_t *row = &kv[((size_t)n * H + h) * ldh + (part ? 2 * NOPE : 0)];
        for (int c = 0; c < w; c++) {
          const float x = n < ctx ? rf() : 300.f;
          const uint32_t hi = bf16_bits(x);
          row[c] = (uint16_t)hi;
          row[w + c] = (uint16_t)bf16_bits(x - __uint_as_float(hi << 16));
        }
      }
  /* selections: dense while a token has at most K complete pools, then K
   * of them (distinct, spread, unordered) and the tail */
  std::vector<int> dense(T), np(T), tail(T), pools((size_t)T * K);
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = n <= K;
    np[t] = n <= K ? n : K;
    tail[t] = n * P;
    for (int i = 0; i < K; i++)
      pools[(size_t)t * K + i] = n <= K ? i : (int)(((uint64_t)t * 7 + (uint64_t)i * (n / K)) % (uint64_t)n);
  }
  /* float64 reference */
  const double scale = 1.0 / sqrt((double)NOPE);
  std::vector<float> ref((size_t)T * H * VD);
  std::vector<int> rows;
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t;
    rows.clear();
    if (dense[t])
      for (int j = 0; j <= pos; j++) rows.push_back(j);
    else {
      for (int i = 0; i < np[t]; i++)
        for (int u = 0; u < P; u++) rows.push_back(pools[(size_t)t * K + i] * P + u);
      for (int j = tail[t]; j <= pos; j++) rows.push_back(j);
    }
    for (int h = 0; h < H; h++) {
      std::vector<double> sc(rows.size()), o(VD, 0.0);
      double mx = -INFINITY, z = 0;
      for (size_t s = 0; s < rows.size(); s++) {
        const uint16_t *kr = &kv[((size_t)rows[s] * H + h) * ldh], *qr = &q16[((size_t)t * H + h) * NOPE];
        double a = 0;
        for (int c = 0; c < NOPE; c++) a += (double)bf(qr[c]) * ((double)bf(kr[c]) + bf(kr[NOPE + c]));
        sc[s] = a * scale;
        mx = std::max(mx, sc[s]);
      }
      for (size_t s = 0; s < rows.size(); s++) {
        const uint16_t *vr = &kv[((size_t)rows[s] * H + h) * ldh + 2 * NOPE];
        const double e = exp(sc[s] - mx);
        z += e;
        for (int d = 0; d < VD; d++) o[d] += e * ((double)bf(vr[d]) + bf(vr[VD + d]));
      }
      for (int d = 0; d < VD; d++) ref[((size_t)t * H + h) * VD + d] = (float)(o[d] / z);
    }
  }
  /* the kernels */
  const int nw = mf_map_words(lrows, P);
  std::vector<uint32_t> map((size_t)T * nw, 0xdeadbeefu);
  std::vector<float> out((size_t)T * H * VD, NAN);
  std::vector<uint16_t> out16((size_t)T * H * VD, 0xffffu);
  const float sl2 = (float)(scale * 1.4426950408889634);
  bool ok = (BN ? mf_cfg<NOPE, VD, BN ? BN : 32>::smem : mw_cfg<NOPE, VD, WBN>::smem) <= sizeof emu_smem_buf;
  ok = ok && emu_launch(dim3(T), dim3(256), [&] { mf_selmap_k(dense.data(), np.data(), pools.data(), K, nw, map.data()); });
  for (int b16 = 0; b16 <= (o16 ? 1 : 0); b16++) {
    void *dst = b16 ? (void *)out16.data() : (void *)out.data();
    if (BN)
      ok = ok && emu_launch(dim3((T + MF_BM - 1) / MF_BM, H), dim3(MF_THREADS), [&] {
             mla_flash_k<NOPE, VD, BN ? BN : 32>(q16.data(), kv.data(), dense.data(), tail.data(), map.data(), nw, &pos0, T, H,
                                                 pshift, lrows, sl2, dst, b16);
           });
    else
      ok = ok && emu_launch(dim3((T + MW_BM - 1) / MW_BM * H), dim3(MW_THREADS), [&] {
             mla_flash_wg_k<NOPE, VD, DG, WBN>(q16.data(), kv.data(), dense.data(), tail.data(), map.data(), nw, &pos0, T, H,
                                               pshift, lrows, sl2, hg, dst, b16);
           });
  }
  if (o16) {
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); i++) bad += out16[i] != (uint16_t)bf16_bits(out[i]);
    CHECK(ok && !bad, "mla flash nope %d vd %d BN %d: %zu bf16 outputs differ from the fp32 output's rounding", NOPE, VD, BN,
          bad);
    printf("mla flash (emulated) nope %-3d vd %-3d BN %-2d bf16 outputs: the fp32 output's rounding %s\n", NOPE, VD, BN,
           ok && !bad ? "yes" : "NO");
  }
  const double err = rows_rel_diff(ref.data(), out.data(), T * H, VD);
  const char *kern = BN == 64 ? "mma.sync 64" : BN ? "mma.sync 32" : DG ? "wgmma K early" : WBN == 32 ? "wgmma 32x2 " : "wgmma 64  ";
  CHECK(ok, "mla flash %d/%d, %s keys per tile: the emulated kernels deadlocked or do not fit", NOPE, VD, kern);
  CHECK(err <= 1e-4, "mla flash nope %d vd %d %s H%d/%d P%d K%d pos0 %d T%d: err %.3g > 1e-4", NOPE, VD, kern, H, hg, P, K,
        pos0, T, err);
  printf("mla flash (emulated) nope %-3d vd %-3d %s H%d/%d P%d K%-2d pos0 %-3d T%-3d vs float64: err %.3g (tol 1e-4)\n", NOPE,
         VD, kern, H, hg, P, K, pos0, T, err);
}

int main() {
  /* 64 and 32 keys per tile */
  flash_case<64, 32, 64>(2, 4, 3, 0, 70); /* dense, then masked past 15 positions; a partial second block */
  flash_case<64, 32, 32>(2, 4, 3, 0, 70);
  flash_case<64, 32, 64>(1, 8, 4, 100, 40); /* a later chunk: keys over three tiles, a partial row of pools */
  flash_case<64, 32, 32>(1, 8, 4, 100, 40);
  flash_case<64, 32, 32>(1, 2, 30, 100, 40); /* pools of 2 and 16 rows */
  flash_case<64, 32, 64>(1, 16, 3, 100, 40);
  flash_case<256, 256, 64>(1, 4, 16, 40, 30); /* the model's widths */
  flash_case<256, 256, 32>(1, 4, 16, 40, 30);
  /* the warpgroup (wgmma) kernel: a block of 128 tokens whose second
   * warpgroup has no rows (T 70), one where both have rows and the first
   * stops a key tile earlier (pos0 100, T 150: keys over four tiles), pools
   * of one row, the model's widths */
  flash_case<64, 32, 0>(2, 4, 3, 0, 70);
  flash_case<64, 32, 0>(2, 4, 3, 100, 150, 2); /* blocks ordered in groups of 2 heads */
  flash_case<64, 32, 0>(1, 8, 4, 100, 150);
  flash_case<64, 32, 0>(1, 1, 40, 100, 150); /* pools of one row: a key tile's pools span two bitmap words */
  /* the tiles without a causal or tail edge take each pool's bit from one
   * word: pools of 2 rows (a tile's 32 pools fill the word), of 16 (4 per tile) */
  flash_case<64, 32, 0>(1, 2, 30, 100, 150);
  flash_case<64, 32, 0>(1, 16, 3, 100, 150);
  flash_case<256, 256, 0>(1, 4, 16, 40, 30);
  flash_case<256, 256, 0>(1, 4, 16, 0, 200);
  /* the next K tile issued right after the score products (MW_DG_EARLYK,
   * the bench's A/B of the order: same results) */
  flash_case<64, 32, 0, MW_DG_EARLYK>(1, 8, 4, 100, 150);
  flash_case<256, 256, 0, MW_DG_EARLYK>(1, 4, 16, 0, 200);
  /* 32-key tiles in two stages: the cases above, tiles of 32 (pools of 1
   * row: a tile's 32 pools fill one word; of 2 rows: half of one) */
  flash_case<64, 32, 0, 0, 32>(2, 4, 3, 0, 70);
  flash_case<64, 32, 0, 0, 32>(2, 4, 3, 100, 150, 2);
  flash_case<64, 32, 0, 0, 32>(1, 8, 4, 100, 150);
  flash_case<64, 32, 0, 0, 32>(1, 1, 40, 100, 150);
  flash_case<64, 32, 0, 0, 32>(1, 2, 30, 100, 150);
  flash_case<64, 32, 0, 0, 32>(1, 16, 3, 100, 150);
  flash_case<256, 256, 0, 0, 32>(1, 4, 16, 40, 30);
  flash_case<256, 256, 0, 0, 32>(1, 4, 16, 0, 200);
  /* bf16 outputs (the output product's x: gk_mla_mha_gemm_out) */
  flash_case<64, 32, 32>(1, 8, 4, 100, 40, 1, true);
  flash_case<64, 32, 0>(2, 4, 3, 100, 150, 2, true);
  TEST_DONE();
}
