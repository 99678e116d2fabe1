/* The chunked KDA prefill kernels (src/gpu/kernels/gk_kda_chunk.cuh) run on
 * the host through the CUDA emulator (tests/emu/cuda_emu.h), against the
 * CPU token recurrence (kda_step, double accumulation): segments of several
 * lengths in one launch (full chunks, partial chunks, one token), each
 * through its own random state, head dims 32/64/128, chunks of 64 and 32
 * tokens, exact and factorised pair products, the lower-bounded
 * gate and the softplus one. q and k are L2-normalised per head as in the
 * model. Output and final states within 1e-4 of the largest value. So the
 * kernels' indexing and the chunked math are checked on every CI run; the
 * device test (test_gpu_kernels) compares them with the GPU token kernel. */
#include "emu/cuda_emu.h"
#include "emu/kda_inputs.h"
extern "C" {
#include "gpu/kernels/gk.h"
#include "model/layers.h"
}
#include "test_util.h"
#include <string.h>

#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_kda_chunk.cuh"

static emu_rng rf{0x9e3779b97f4a7c15ull};
template <int HD, int KC, bool FACT> static void chunk_case(const int *lens, int nseg, float lb, float gshift = 0) {
  const int H = 2, inner = H * HD, ch = 3 * inner;
  int T = 0, maxlen = 0;
  for (int z = 0; z < nseg; z++) T += lens[z], maxlen = std::max(maxlen, lens[z]);
  std::vector<float> qkv, graw, bl, dtb, Al;
  kda_random_inputs(rf, T, H, HD, gshift, qkv, graw, bl, dtb, Al); /* gshift 30: every gate at its bound */
  const size_t ns = (size_t)H * HD * HD;
  std::vector<float> S((size_t)nseg * ns), o((size_t)T * inner, NAN);
  for (auto &x : S) x = 0.2f * rf();
  /* the CPU token recurrence first (the kernels overwrite qkv and graw) */
  std::vector<float> So(S), oref((size_t)T * inner), Sref(S);
  {
    std::vector<float> Sh((size_t)HD * HD), g(HD);
    for (int z = 0, t0 = 0; z < nseg; t0 += lens[z], z++)
      for (int h = 0; h < H; h++) {
        float *Sg = &Sref[z * ns + (size_t)h * HD * HD]; /* [j][i] on the GPU, [i][j] in kda_step */
        for (int i = 0; i < HD; i++)
          for (int j = 0; j < HD; j++) Sh[(size_t)i * HD + j] = Sg[(size_t)j * HD + i];
        for (int t = t0; t < t0 + lens[z]; t++) {
          const float *row = &qkv[(size_t)t * ch];
          for (int i = 0; i < HD; i++) g[i] = kda_gate1(graw[(size_t)t * inner + h * HD + i], dtb.data(), Al.data(), h, h * HD + i, lb);
          kda_step(Sh.data(), row + h * HD, row + inner + h * HD, row + 2 * inner + h * HD, g.data(),
                   sigm(bl[(size_t)t * H + h]), HD, HD, &oref[(size_t)t * inner + h * HD]);
        }
        for (int i = 0; i < HD; i++)
          for (int j = 0; j < HD; j++) Sg[(size_t)j * HD + i] = Sh[(size_t)i * HD + j];
      }
  }
  std::vector<gk_lstate> ls(nseg);
  std::vector<gk_seg> seg(nseg);
  std::vector<int> tseg(T);
  for (int z = 0, t0 = 0; z < nseg; t0 += lens[z], z++) {
    memset(&ls[z], 0, sizeof ls[z]);
    ls[z].p[GK_ST_S] = &S[z * ns];
    seg[z] = gk_seg{&ls[z], t0, lens[z], 5, 0};
    for (int t = t0; t < t0 + lens[z]; t++) tseg[t] = z;
  }
  gk_batch b{};
  b.seg = seg.data();
  b.tseg = tseg.data();
  b.nseg = nseg;
  b.maxlen = maxlen;
  b.layer = 0;
  std::vector<float> work((size_t)T * H * (KC + HD));
  float *aqk = work.data(), *glb = aqk + (size_t)T * H * KC;
  const size_t need = std::max(kc_prep_floats<HD, KC, FACT>(), kc_pass_floats<HD, KC>());
  CHECK(need <= sizeof emu_smem_buf / sizeof *emu_smem_buf, "shared memory of the emulation too small");
  bool ok = emu_launch(dim3((maxlen + KC - 1) / KC, H, nseg), dim3(KCT), [&] {
    kda_chunk_prep_k<HD, KC, FACT>(b, qkv.data(), graw.data(), dtb.data(), Al.data(), lb, bl.data(), H, aqk, glb);
  });
  ok = ok && emu_launch(dim3(H, HD / KCB, nseg), dim3(KCT), [&] {
    kda_chunk_pass_k<HD, KC>(b, qkv.data(), graw.data(), aqk, glb, H, o.data());
  });
  CHECK(ok, "hd %d: the emulated kernels deadlocked", HD);
  /* max |err| / max |ref| (test_util.h, one row) */
  const double eo = rows_rel_diff(oref.data(), o.data(), 1, (int)o.size());
  const double es = rows_rel_diff(Sref.data(), S.data(), 1, (int)S.size());
  char nm[96];
  int k = snprintf(nm, sizeof nm, "hd %d, chunk %d, %s pairs, lb %g%s, segments", HD, KC, FACT ? "factorised" : "exact", lb,
                 gshift ? " (gates at the bound)" : "");
  for (int z = 0; z < nseg && k < (int)sizeof nm - 8; z++) k += snprintf(nm + k, sizeof nm - k, " %d", lens[z]);
  CHECK(eo <= 1e-4 && es <= 1e-4, "%s: output err %.3g, state err %.3g > 1e-4", nm, eo, es);
  printf("kda chunked kernels (emulated) vs CPU token recurrence (%s): output err %.3g, state err %.3g (tol 1e-4)\n", nm, eo,
         es);
}

/* the emulator itself: warp sums through its shuffles, __syncthreads
 * ordering shared-memory writes, and a shuffle one lane never reaches
 * reported as a deadlock */
static void emu_selfcheck() {
  std::vector<float> out(256);
  bool ok = emu_launch(dim3(2), dim3(256), [&] {
    const int t = threadIdx.x;
    emu_smem_buf[t] = (float)(t + blockIdx.x);
    __syncthreads();
    const float v = warp_sum(emu_smem_buf[255 - t]); /* another warp's writes */
    if (blockIdx.x == 1) out[t] = v;
  });
  bool sums = ok;
  for (int t = 0; t < 256; t++) {
    const int w0 = 255 - (t | 31); /* the mirrored warp's first thread */
    sums = sums && out[t] == (float)(32 * (w0 + 1) + 31 * 32 / 2);
  }
  CHECK(ok && sums, "emulator: warp sums after __syncthreads");
  fprintf(stderr, "(a deadlock report follows, on purpose)\n");
  const bool dead = !emu_launch(dim3(1), dim3(64), [&] {
    if (threadIdx.x == 37) return;
    (void)warp_sum(1.0f);
  });
  CHECK(dead, "emulator: a shuffle that lane 5 of warp 1 never reaches is not reported");
}

int main() {
  emu_selfcheck();
  static const int l1[] = {130, 1, 64}, l2[] = {150}, l3[] = {97, 65, 3};
  chunk_case<128, 64, false>(l1, 3, -5.0f); /* the model's head dim */
  chunk_case<64, 64, false>(l2, 1, NAN);    /* no lower bound: the softplus gate */
  chunk_case<32, 64, false>(l3, 3, -5.0f);
  chunk_case<128, 32, false>(l1, 3, -5.0f); /* 32-token chunks */
  chunk_case<32, 32, false>(l3, 3, NAN);
  /* the factorised pair products (bounded gates only): the model's bound,
   * the largest the host allows, 32-token chunks */
  chunk_case<128, 64, true>(l1, 3, -5.0f);
  chunk_case<64, 64, true>(l2, 1, -5.3f);
  chunk_case<32, 32, true>(l3, 3, -5.0f);
  chunk_case<64, 64, true>(l2, 1, -5.3f, 30.0f); /* the diagonal factor at exp(79.5) */
  chunk_case<64, 64, false>(l2, 1, -5.3f, 30.0f);
  TEST_DONE();
}
