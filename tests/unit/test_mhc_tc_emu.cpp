/* The tensor-core mHC projection (src/gpu/kernels/gk_mhc_tc.cuh: 3xTF32
 * mma.sync over column splits, then the splits added in order) runs on the
 * host through the CUDA emulator against float64 sums: mixraw within 2e-6
 * of each token's largest |output| and ssq within 2e-6 relative (3xTF32
 * keeps ~2^-21 per product; one rounding per tf32 split measured here
 * would show as ~5e-4). Shapes: a width past one split with a partial last
 * split (D 300: 1200 columns), whole splits only (D 512), a token count
 * that leaves a partial warp and a partial block (T 37), and one split
 * narrower than 16 columns' multiple (D 6: 24 columns). Also: the same
 * token's sums do not depend on T (the split count depends on the width
 * only), bitwise. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
}
#include "test_util.h"

#include "gpu/kernels/gk_mhc_tc.cuh"

static uint64_t g_s = 0xa4093822299f31d0ull;
static uint64_t rnd() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return g_s;
}
static float rf() { return (float)((rnd() >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

static bool run(const std::vector<float> &X, const std::vector<float> &fn, int T, int n, std::vector<float> &mix,
                std::vector<float> &ssq) {
  const int S = mt_splits(n);
  std::vector<float> part((size_t)S * T * MT_PART, NAN);
  mix.assign((size_t)T * MT_MIX, NAN);
  ssq.assign(T, NAN);
  bool ok = emu_launch(dim3((T + 63) / 64, S), dim3(128), [&] { mhc_proj_tc_k(X.data(), fn.data(), T, n, part.data()); });
  ok = ok && emu_launch(dim3((T * MT_PART + 255) / 256), dim3(256),
                        [&] { mhc_proj_sum_k(part.data(), S, T, mix.data(), ssq.data()); });
  return ok;
}

static void mt_case(int T, int D) {
  const int n = 4 * D;
  std::vector<float> X((size_t)T * n), fn((size_t)MT_MIX * n);
  for (auto &x : X) x = rf();
  for (auto &x : fn) x = 0.02f * rf();
  std::vector<float> rmix((size_t)T * MT_MIX), rss(T);
  for (int t = 0; t < T; t++) {
    double q = 0;
    for (int c = 0; c < n; c++) q += (double)X[(size_t)t * n + c] * X[(size_t)t * n + c];
    rss[t] = (float)q;
    for (int o = 0; o < MT_MIX; o++) {
      double a = 0;
      for (int c = 0; c < n; c++) a += (double)fn[(size_t)o * n + c] * X[(size_t)t * n + c];
      rmix[(size_t)t * MT_MIX + o] = (float)a;
    }
  }
  std::vector<float> mix, ssq;
  const bool ok = run(X, fn, T, n, mix, ssq);
  const double em = rows_rel_diff(rmix.data(), mix.data(), T, MT_MIX), es = rows_rel_diff(rss.data(), ssq.data(), 1, T);
  CHECK(ok, "mhc proj tc T%d D%d: the emulated kernels deadlocked", T, D);
  CHECK(em <= 2e-6 && es <= 2e-6, "mhc proj tc T%d D%d: mixraw err %.3g, ssq err %.3g (tol 2e-6)", T, D, em, es);
  printf("mhc proj tensor-core form (emulated) T%-3d D%-4d %d split(s) vs float64: mixraw err %.3g, ssq err %.3g (tol 2e-6)\n",
         T, D, mt_splits(n), em, es);
  /* the first 5 tokens alone: the same bits */
  std::vector<float> X5(X.begin(), X.begin() + (size_t)5 * n), mix5, ssq5;
  const bool ok5 = run(X5, fn, 5, n, mix5, ssq5);
  const bool same = ok5 && !memcmp(mix5.data(), mix.data(), (size_t)5 * MT_MIX * 4) && !memcmp(ssq5.data(), ssq.data(), 5 * 4);
  CHECK(same, "mhc proj tc T%d D%d: the first 5 tokens differ from 5 alone", T, D);
}

int main() {
  mt_case(37, 300);
  mt_case(70, 512);
  mt_case(9, 6);
  TEST_DONE();
}
