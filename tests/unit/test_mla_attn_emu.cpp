/* The absorbed MLA attention cores (src/gpu/kernels/gk_mla_attn.cuh) run on
 * the host through the CUDA emulator (tests/emu/cuda_emu.h) over a latent
 * cache in pages whose table is in reverse order, against a float64
 * softmax attention over the same selections: a dense token (every row),
 * sparse tokens (K pools in a shuffled order, then the tail), one part and
 * flash-decoding parts merged by mla_merge_k, the head-sharing core (a
 * partial second head group) and the per-head one. Output within 1e-5 of
 * the largest value. So the paged row addressing (gk_prow) and the
 * selection walk are checked on every CI run, not only at the device's
 * startup validation. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
}
#include "test_util.h"
#include <string.h>

#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_mla_attn.cuh"

static uint64_t g_s = 0x243f6a8885a308d3ull;
static uint64_t rnd() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return g_s;
}
static float rf() { return (float)((rnd() >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

int main() {
  const int kl = 64, H = 20, P = 4, K = 3, T = 6, pos0 = 40, rows = pos0 + T, pshift = 3, prow = 1 << pshift;
  const float scale = 0.125f;
  /* the latent cache: pages of 8 rows, the table in reverse page order */
  const int npages = (rows + prow - 1) / prow;
  std::vector<std::vector<float>> pages(npages, std::vector<float>((size_t)prow * kl));
  std::vector<float *> table(npages);
  for (int p = 0; p < npages; p++) table[p] = pages[npages - 1 - p].data();
  auto lat = [&](int r) { return table[r >> pshift] + (size_t)(r & (prow - 1)) * kl; };
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < kl; c++) lat(r)[c] = rf();
  gk_lstate ls;
  memset(&ls, 0, sizeof ls);
  ls.pg[GK_ST_LATENT] = table.data();
  ls.pshift = pshift;
  gk_seg seg = {&ls, 0, T, pos0, 0};
  std::vector<int> tseg(T, 0), dense(T), npools(T), tail(T), pools((size_t)T * K);
  gk_batch b{};
  b.seg = &seg;
  b.tseg = tseg.data();
  b.nseg = 1;
  b.maxlen = T;
  /* token 0 dense; the others K of their complete pools (shuffled), then
   * the rows from their pool count on */
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = t == 0;
    npools[t] = t == 0 ? n : K;
    tail[t] = t == 0 ? 0 : n * P;
    std::vector<int> all(n);
    for (int p = 0; p < n; p++) all[p] = p;
    for (int p = n - 1; p > 0; p--) std::swap(all[p], all[rnd() % (p + 1)]);
    for (int k = 0; k < K; k++) pools[(size_t)t * K + k] = all[k];
  }
  std::vector<float> qt((size_t)T * H * kl), ref((size_t)T * H * kl);
  for (auto &x : qt) x = rf();
  int maxN = 0;
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, N = dense[t] ? pos + 1 : npools[t] * P + std::max(0, pos - tail[t] + 1);
    maxN = std::max(maxN, N);
    for (int h = 0; h < H; h++) {
      const float *q = &qt[((size_t)t * H + h) * kl];
      std::vector<double> sc(N);
      double mx = -INFINITY, z = 0;
      for (int s = 0; s < N; s++) {
        const int r = dense[t] ? s : s < K * P ? pools[(size_t)t * K + s / P] * P + s % P : tail[t] + s - K * P;
        double d = 0;
        for (int c = 0; c < kl; c++) d += (double)q[c] * lat(r)[c];
        sc[s] = d * scale;
        mx = std::max(mx, sc[s]);
      }
      std::vector<double> acc(kl, 0.0);
      for (int s = 0; s < N; s++) {
        const int r = dense[t] ? s : s < K * P ? pools[(size_t)t * K + s / P] * P + s % P : tail[t] + s - K * P;
        const double p = exp(sc[s] - mx);
        z += p;
        for (int c = 0; c < kl; c++) acc[c] += p * lat(r)[c];
      }
      for (int c = 0; c < kl; c++) ref[((size_t)t * H + h) * kl + c] = (float)(acc[c] / z);
    }
  }
  for (int core = 0; core < 2; core++)     /* head-sharing, per head */
    for (int split = 0; split < 2; split++) { /* one part; flash-decoding parts and the merge */
      const int chunk = split ? (core ? 32 : HS_R) : 0;
      const int nsplit = split ? std::min(MLA_PARTS, (maxN + chunk - 1) / chunk) : 1;
      std::vector<float> ob((size_t)T * H * kl, NAN), part((size_t)T * H * nsplit * (kl + 2), NAN);
      bool ok;
      if (core == 0) {
        ok = hs_smem(kl) <= sizeof emu_smem_buf;
        ok = ok && emu_launch(dim3(T, (H + HS_HG - 1) / HS_HG, nsplit), dim3(256), [&] {
          mla_hs_k(qt.data(), b, dense.data(), npools.data(), tail.data(), pools.data(), H, kl, P, K, scale, chunk, nsplit,
                   part.data(), ob.data());
        });
      } else {
        ok = emu_launch(dim3(T, H, nsplit), dim3(256), [&] {
          mla_attn_k(qt.data(), b, dense.data(), npools.data(), tail.data(), pools.data(), H, kl, P, K, scale, chunk,
                     nsplit, part.data(), ob.data());
        });
      }
      if (nsplit > 1)
        ok = ok && emu_launch(dim3(T * H), dim3(256), [&] {
          mla_merge_k(part.data(), b, dense.data(), npools.data(), tail.data(), H, P, chunk, nsplit, kl, ob.data());
        });
      const double err = rows_rel_diff(ref.data(), ob.data(), 1, (int)ref.size());
      const char *nm = core ? "per-head core" : "head-sharing core";
      CHECK(ok, "%s: the emulated kernels deadlocked", nm);
      CHECK(err <= 1e-5, "%s, %d part(s): err %.3g > 1e-5", nm, nsplit, err);
      printf("mla attention (emulated), %s, %d part(s), paged latent cache (reversed 8-row pages) vs float64: err %.3g "
             "(tol 1e-5)\n", nm, nsplit, err);
    }
  TEST_DONE();
}
