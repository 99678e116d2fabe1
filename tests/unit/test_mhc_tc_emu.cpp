/* The tensor-core mHC projection (src/gpu/kernels/gk_mhc_tc.cuh: 3xTF32
 * mma.sync over column splits, then the splits added in order) runs on the
 * host through the CUDA emulator against float64 sums: mixraw within 2e-6
 * of each token's largest |output| and ssq within 2e-6 relative (3xTF32
 * keeps ~2^-21 per product; one rounding per tf32 split measured here
 * would show as ~5e-4). Shapes: a width past one split with a partial last
 * split (D 300: 1200 columns), whole splits only (D 512), a token count
 * that leaves a partial warp and a partial block (T 37), and one split
 * narrower than 16 columns' multiple (D 6: 24 columns); steps of 16 and of
 * 32 columns (GLM53_GPU_MHC_K32). Also: the same
 * token's sums do not depend on T (the split count depends on the width
 * only), bitwise.
 *
 * The fused post + projection (mhc_post_proj_tc_k, with and without the
 * MoE combine) against float64: the new streams within 1e-6 of each
 * token's largest |value| (the post's own fp32 arithmetic, a few
 * roundings), the projection of the streams it wrote within 2e-6 as above;
 * the MoE case has repeated and negative expert ids (moe_sum adds the
 * first pair of each distinct id >= 0, ascending) and an erow map; the
 * first 5 tokens alone give the same bits. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
}
#include "test_util.h"

#include "gpu/kernels/gk_mhc_post.cuh"
#include "gpu/kernels/gk_mhc_tc.cuh"

static uint64_t g_s = 0xa4093822299f31d0ull;
static uint64_t rnd() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return g_s;
}
static float rf() { return (float)((rnd() >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

template <int NV>
static bool run(const std::vector<float> &X, const std::vector<float> &fn, int T, int n, std::vector<float> &mix,
                std::vector<float> &ssq) {
  const int S = mt_splits(n);
  std::vector<float> part((size_t)S * T * MT_PART, NAN);
  mix.assign((size_t)T * MT_MIX, NAN);
  ssq.assign(T, NAN);
  bool ok = emu_launch(dim3((T + 63) / 64, S), dim3(128), [&] { mhc_proj_tc_k<NV>(X.data(), fn.data(), T, n, part.data()); });
  ok = ok && emu_launch(dim3((T * MT_PART + 255) / 256), dim3(256),
                        [&] { mhc_proj_sum_k(part.data(), S, T, mix.data(), ssq.data()); });
  return ok;
}

/* float64 mixraw = fn . X_t and ssq = X_t . X_t of T rows of n columns */
static void ref_proj(const std::vector<float> &X, const std::vector<float> &fn, int T, int n, std::vector<float> &rmix,
                     std::vector<float> &rss) {
  rmix.assign((size_t)T * MT_MIX, 0.f);
  rss.assign(T, 0.f);
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
}

/* NV: float4s per lane and step (1: 16 columns, 2: 32) */
template <int NV> static void mt_case(int T, int D) {
  const int n = 4 * D;
  std::vector<float> X((size_t)T * n), fn((size_t)MT_MIX * n);
  for (auto &x : X) x = rf();
  for (auto &x : fn) x = 0.02f * rf();
  std::vector<float> rmix, rss;
  ref_proj(X, fn, T, n, rmix, rss);
  std::vector<float> mix, ssq;
  const bool ok = run<NV>(X, fn, T, n, mix, ssq);
  const double em = rows_rel_diff(rmix.data(), mix.data(), T, MT_MIX), es = rows_rel_diff(rss.data(), ssq.data(), 1, T);
  CHECK(ok, "mhc proj tc NV%d T%d D%d: the emulated kernels deadlocked", NV, T, D);
  CHECK(em <= 2e-6 && es <= 2e-6, "mhc proj tc NV%d T%d D%d: mixraw err %.3g, ssq err %.3g (tol 2e-6)", NV, T, D, em, es);
  printf("mhc proj tensor-core form (emulated) NV%d T%-3d D%-4d %d split(s) vs float64: mixraw err %.3g, ssq err %.3g (tol 2e-6)\n",
         NV, T, D, mt_splits(n), em, es);
  /* the first 5 tokens alone: the same bits */
  std::vector<float> X5(X.begin(), X.begin() + (size_t)5 * n), mix5, ssq5;
  const bool ok5 = run<NV>(X5, fn, 5, n, mix5, ssq5);
  const bool same = ok5 && !memcmp(mix5.data(), mix.data(), (size_t)5 * MT_MIX * 4) && !memcmp(ssq5.data(), ssq.data(), 5 * 4);
  CHECK(same, "mhc proj tc NV%d T%d D%d: the first 5 tokens differ from 5 alone", NV, T, D);
}

/* the fused kernel over T tokens of width D (X updated in place); moe:
 * K = 4 pairs per token through erow */
struct fz_in {
  std::vector<float> a, eo, wt, post, comb, fn;
  std::vector<int> idx, erow;
};
static bool run_fused(std::vector<float> &X, const fz_in &in, bool moe, int T, int D, std::vector<float> &mix,
                      std::vector<float> &ssq) {
  const int S = mt_dsplits(D), K = 4;
  std::vector<float> part((size_t)S * T * MT_PART, NAN);
  mix.assign((size_t)T * MT_MIX, NAN);
  ssq.assign(T, NAN);
  bool ok = emu_launch(dim3((T + 63) / 64, S), dim3(128), [&] {
    if (moe)
      mhc_post_proj_tc_k<true>(X.data(), in.a.data(), in.eo.data(), in.erow.data(), in.idx.data(), in.wt.data(), K,
                               in.post.data(), in.comb.data(), in.fn.data(), T, D, part.data());
    else
      mhc_post_proj_tc_k<false>(X.data(), in.a.data(), nullptr, nullptr, nullptr, nullptr, 0, in.post.data(), in.comb.data(),
                                in.fn.data(), T, D, part.data());
  });
  ok = ok && emu_launch(dim3((T * MT_PART + 255) / 256), dim3(256),
                        [&] { mhc_proj_sum_k(part.data(), S, T, mix.data(), ssq.data()); });
  return ok;
}
static void fused_case(int T, int D, bool moe) {
  const int n = 4 * D, K = 4, NP = T * K;
  std::vector<float> X((size_t)T * n);
  fz_in in;
  for (auto &x : X) x = rf();
  in.a.resize((size_t)T * D);
  for (auto &x : in.a) x = rf();
  in.fn.resize((size_t)MT_MIX * n);
  for (auto &x : in.fn) x = 0.02f * rf();
  in.post.resize((size_t)T * 4);
  for (auto &x : in.post) x = 1.0f + rf();
  in.comb.resize((size_t)T * 16);
  for (auto &x : in.comb) x = 0.5f + 0.5f * rf();
  if (moe) {
    in.idx.resize(NP);
    in.wt.resize(NP);
    in.erow.resize(NP);
    in.eo.resize((size_t)NP * D);
    for (int p = 0; p < NP; p++) {
      in.idx[p] = (int)(rnd() % 7) - 1; /* -1 .. 5 over 4 pairs: repeats and skipped pairs */
      in.wt[p] = 0.5f * rf();
      in.erow[p] = NP - 1 - p;
    }
    for (auto &x : in.eo) x = rf();
  }
  /* float64 post */
  std::vector<double> rX((size_t)T * n);
  for (int t = 0; t < T; t++)
    for (int d = 0; d < D; d++) {
      double y = in.a[(size_t)t * D + d];
      if (moe) {
        for (int e = 0; e < 8; e++) /* ascending id, the first pair of each */
          for (int j = 0; j < K; j++)
            if (in.idx[t * K + j] == e) {
              y += (double)in.wt[t * K + j] * in.eo[(size_t)in.erow[t * K + j] * D + d];
              break;
            }
      }
      for (int h = 0; h < 4; h++) {
        double acc = (double)in.post[t * 4 + h] * y;
        for (int g = 0; g < 4; g++) acc += (double)in.comb[t * 16 + g * 4 + h] * X[(size_t)t * n + g * D + d];
        rX[(size_t)t * n + h * D + d] = acc;
      }
    }
  const std::vector<float> X0 = X;
  std::vector<float> mix, ssq;
  const bool ok = run_fused(X, in, moe, T, D, mix, ssq);
  CHECK(ok, "mhc post+proj T%d D%d: the emulated kernels deadlocked", T, D);
  std::vector<float> rXf(rX.begin(), rX.end());
  const double ex = rows_rel_diff(rXf.data(), X.data(), T, n);
  /* the projection of what the kernel wrote */
  std::vector<float> rmix, rss;
  ref_proj(X, in.fn, T, n, rmix, rss);
  const double em = rows_rel_diff(rmix.data(), mix.data(), T, MT_MIX), es = rows_rel_diff(rss.data(), ssq.data(), 1, T);
  CHECK(ex <= 1e-6 && em <= 2e-6 && es <= 2e-6,
        "mhc post+proj%s T%d D%d: X err %.3g (tol 1e-6), mixraw err %.3g, ssq err %.3g (tol 2e-6)", moe ? " (moe)" : "", T, D,
        ex, em, es);
  printf("mhc post + proj fused (emulated%s) T%-3d D%-4d %d split(s) vs float64: X err %.3g (tol 1e-6), mixraw err %.3g, ssq "
         "err %.3g (tol 2e-6)\n",
         moe ? ", moe" : "", T, D, mt_dsplits(D), ex, em, es);
  /* the first 5 tokens alone (their pairs keep their eo rows): the same bits */
  std::vector<float> X5(X0.begin(), X0.begin() + (size_t)5 * n), mix5, ssq5;
  fz_in in5 = in;
  in5.a.resize((size_t)5 * D);
  const bool ok5 = run_fused(X5, in5, moe, 5, D, mix5, ssq5);
  const bool same = ok5 && !memcmp(mix5.data(), mix.data(), (size_t)5 * MT_MIX * 4) && !memcmp(ssq5.data(), ssq.data(), 5 * 4) &&
                    !memcmp(X5.data(), X.data(), (size_t)5 * n * 4);
  CHECK(same, "mhc post+proj T%d D%d: the first 5 tokens differ from 5 alone", T, D);
}

int main() {
  mt_case<1>(37, 300);
  mt_case<1>(70, 512);
  mt_case<1>(9, 6);
  /* 32 columns per step: a split ending half-way through a step (1200 columns), 24 columns */
  mt_case<2>(37, 300);
  mt_case<2>(70, 512);
  mt_case<2>(9, 6);
  fused_case(37, 300, false);
  fused_case(37, 300, true);
  fused_case(70, 512, true);
  fused_case(9, 8, true);
  TEST_DONE();
}
