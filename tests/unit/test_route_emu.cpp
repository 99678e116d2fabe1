/* The per-token device code that two launches share since the
 * twenty-second session runs on the host through the CUDA emulator
 * against the CPU reference:
 *  - the MoE routing of one token by one warp (src/gpu/kernels/
 *    gk_route.cuh route_token: the route launch and the router GEMV's last
 *    block) against moe.c moe_route: the same ids, weights within 1e-6
 *    relative (the same serial double sums; exact on most hosts), 4 warps
 *    of a block routing 7 tokens, for 288 experts top-8 in one group and
 *    64 experts top-6 in 8 groups of which 3 are kept;
 *  - the mHC pre of one token by one block (gk_mhc_pre.cuh mhc_pre_tok:
 *    the pre launch and the projection GEMV's last block) against mhc.c
 *    mhc_pre + rmsnorm: y, post and comb within 1e-5 of their largest
 *    values (fp32 in both, different summation orders), for the model's
 *    4 streams compiled in (float4 rows, D 1024) and the generic scalar
 *    path (D 302), the bf16 copy of y equal to y's rounding. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/model.h"
#include "core/util.h"
}
#include "test_util.h"
#include <string.h>

/* the formats route_prefetch names (gk_common.cuh on a device) */
enum { GF_F32 = 1, GF_BF16 = 2, GF_Q8 = 3, GF_Q4 = 4 };
#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_route.cuh"
#include "gpu/kernels/gk_mhc_pre.cuh"

static uint64_t g_s = 0x452821e638d01377ull;
static float rf() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return (float)((g_s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* moe_route_k's body: ROUTE_WARPS warps per block, one token each */
static void route_block(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int *idx,
                        float *wt) {
  __shared__ route_smem sm[ROUTE_WARPS];
  const int w = threadIdx.x >> 5, t = blockIdx.x * ROUTE_WARPS + w;
  if (t >= T) return;
  route_token(logits + (size_t)t * E, bias, E, k, G, topk_group, 1, 2.5f, idx + (size_t)t * k, wt + (size_t)t * k, NULL, 0,
              NULL, 0, sm[w]);
}

static void route_case(int E, int k, int G, int topk_group) {
  const int T = 7;
  std::vector<float> lg((size_t)T * E), bias(E), wt((size_t)T * k, NAN), rwt(k);
  std::vector<int> idx((size_t)T * k, -7), ridx(k);
  for (auto &x : lg) x = 4 * rf();
  for (auto &x : bias) x = 0.5f * rf();
  glm53_config c;
  memset(&c, 0, sizeof c);
  c.n_routed_experts = E, c.num_experts_per_tok = k, c.n_group = G, c.topk_group = topk_group, c.norm_topk_prob = 1;
  c.routed_scaling_factor = 2.5f;
  const bool ok = emu_launch(dim3((T + ROUTE_WARPS - 1) / ROUTE_WARPS), dim3(32 * ROUTE_WARPS), [&] {
    route_block(lg.data(), bias.data(), T, E, k, G, topk_group, idx.data(), wt.data());
  });
  bool ids = ok;
  double e = ok ? 0 : INFINITY;
  for (int t = 0; t < T; t++) {
    moe_route(&c, lg.data() + (size_t)t * E, bias.data(), ridx.data(), rwt.data());
    for (int i = 0; i < k; i++) {
      ids = ids && idx[(size_t)t * k + i] == ridx[i];
      e = fmax(e, fabs((double)wt[(size_t)t * k + i] - rwt[i]) / fabs((double)rwt[i]));
    }
  }
  CHECK(ids && e <= 1e-6, "route_token (E %d, top-%d, groups %d/%d): ids %s, weights %.3g (tol 1e-6)", E, k, topk_group, G,
        ids ? "equal" : "DIFFER", e);
  printf("route_token (emulated), %d tokens, E %d top-%d, groups %d/%d: ids %s, weights vs CPU %.2g (tol 1e-6)\n", T, E, k,
         topk_group, G, ids ? "equal" : "DIFFER", e);
}

template <bool VEC, int HC>
static void pre_block(const float *X, const float *mix, const float *base, const float *sc, const float *nw, int D, float *post,
                      float *comb, float *y, uint16_t *y16) {
  mhc_pre_tok<VEC, false, HC>(X, mix, NULL, base, sc, nw, 4, D, 20, 1e-6f, 1e-5f, post, comb, y, y16, blockIdx.x);
}

static double relmax(const std::vector<float> &g, const std::vector<float> &r) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < g.size(); i++) {
    mx = fmax(mx, fabs((double)r[i]));
    d = std::isnan(g[i]) ? INFINITY : fmax(d, fabs((double)g[i] - r[i]));
  }
  return d / fmax(mx, 1e-30);
}

template <bool VEC, int HC> static void pre_case(int D) {
  const int T = 2, hc = 4, n = hc * D, nmix = (2 + hc) * hc;
  glm53_config c;
  memset(&c, 0, sizeof c);
  c.hc_mult = hc, c.hidden_size = D, c.hc_sinkhorn_iters = 20, c.hc_eps = 1e-6f, c.rms_norm_eps = 1e-5f;
  alignas(16) static float X[2 * 4 * 1024], fn[24 * 4 * 1024], y[2 * 1024], nw[1024];
  alignas(16) static uint16_t y16[2 * 1024];
  std::vector<float> mix((size_t)T * nmix), base(nmix), sc(3), post((size_t)T * hc, NAN), comb((size_t)T * hc * hc, NAN);
  for (int i = 0; i < T * n; i++) X[i] = rf();
  for (int i = 0; i < nmix * n; i++) fn[i] = 0.02f * rf();
  for (auto &x : base) x = 0.5f * rf();
  for (auto &x : sc) x = 1 + 0.2f * rf();
  for (int i = 0; i < D; i++) nw[i] = 1 + 0.2f * rf();
  for (int t = 0; t < T; t++) /* the projection's fp32 output (any summation order) */
    for (int o = 0; o < nmix; o++) {
      double a = 0;
      for (int i = 0; i < n; i++) a += (double)fn[(size_t)o * n + i] * X[(size_t)t * n + i];
      mix[(size_t)t * nmix + o] = (float)a;
    }
  const bool ok = emu_launch(dim3(T), dim3(256), [&] {
    pre_block<VEC, HC>(X, mix.data(), base.data(), sc.data(), nw, D, post.data(), comb.data(), y, y16);
  });
  std::vector<float> ry((size_t)T * D), rp((size_t)T * hc), rc((size_t)T * hc * hc), gy(y, y + (size_t)T * D);
  mhc_weights w = {fn, base.data(), sc.data()};
  for (int t = 0; t < T; t++) {
    mhc_pre(&w, &c, X + (size_t)t * n, rp.data() + t * hc, rc.data() + t * hc * hc, ry.data() + (size_t)t * D);
    rmsnorm(ry.data() + (size_t)t * D, ry.data() + (size_t)t * D, nw, D, c.rms_norm_eps);
  }
  const double ey = ok ? relmax(gy, ry) : INFINITY, ep = relmax(post, rp), ec = relmax(comb, rc);
  size_t bad16 = 0;
  for (int i = 0; i < T * D; i++) bad16 += y16[i] != f32_to_bf16(y[i]);
  CHECK(ey <= 1e-5 && ep <= 1e-5 && ec <= 1e-5 && !bad16, "mhc_pre_tok (%s, D %d): y %.3g post %.3g comb %.3g (tol 1e-5), "
        "%zu bf16 copies not y's rounding", VEC ? "float4" : "scalar", D, ey, ep, ec, bad16);
  printf("mhc_pre_tok (emulated, %s rows%s), %d tokens, D %d: vs CPU y %.2g post %.2g comb %.2g (tol 1e-5); bf16 copy %s\n",
         VEC ? "float4" : "scalar", HC ? ", 4 streams compiled in" : "", T, D, ey, ep, ec, bad16 ? "WRONG" : "= y's rounding");
}

int main() {
  route_case(288, 8, 1, 1);
  route_case(64, 6, 8, 3);
  pre_case<true, 4>(1024);
  pre_case<false, 0>(302);
  TEST_DONE();
}
