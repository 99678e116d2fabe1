/* The KDA token recurrence with 8 or 16 lanes per column (kda_recur8_k,
 * src/gpu/kernels/gk_kda_recur.cuh) run on the host through the CUDA
 * emulator (tests/emu/cuda_emu.h), against the CPU token recurrence
 * (kda_step): head dims 32/64/128, 1, 2 and 4 columns per lane group,
 * segments of several lengths in one launch with tiles that split them
 * (7 tokens), each segment through its own random state; output and final
 * states within 1e-4 of the largest value. Then the kernel's promise that
 * decode and prefill agree bitwise: the same tokens one launch per token
 * with the gate transformed as the tile is read (KR_RAW, synchronous
 * tiles, as decode runs it) and with the log decay (KR_LOG, as
 * gk_kda_recur runs it) give the prefill launch's bits (KR_DECAY, the
 * copied tiles). And 4, 2 and 1 columns per group (layouts g4, g2, g1)
 * give the same bits, and so do 16 lanes per column with 4 or 2 columns
 * (x4, x2) and 32 with 4 (y4). The device test (test_gpu_kernels) runs it on the GPU. */
#include "emu/cuda_emu.h"
#include "emu/kda_inputs.h"
extern "C" {
#include "gpu/kernels/gk.h"
#include "model/layers.h"
}
#include "test_util.h"
#include <string.h>

#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_kda_recur.cuh"

static const uint64_t SEED = 0x2545f4914f6cdd1dull;
static emu_rng rf{SEED};

/* one launch of kda_recur8_k over the segments lens[] (tiles of TT tokens) */
template <int MODE, int MM, bool ASYNC, int C, int LP>
static bool launch(const std::vector<int> &t0s, const std::vector<int> &lens, std::vector<float *> states,
                   const float *qkv, const float *g, const float *dtb, const float *Al, float lb, const float *bl, int H,
                   int TT, float *o) {
  const int nseg = (int)lens.size();
  std::vector<gk_lstate> ls(nseg);
  std::vector<gk_seg> seg(nseg);
  int maxlen = 0, T = 0;
  for (int z = 0; z < nseg; z++) {
    memset(&ls[z], 0, sizeof ls[z]);
    ls[z].p[GK_ST_S] = states[z];
    seg[z] = gk_seg{&ls[z], t0s[z], lens[z], 0, 0};
    maxlen = std::max(maxlen, lens[z]);
    T = std::max(T, t0s[z] + lens[z]);
  }
  std::vector<int> tseg(T, 0);
  gk_batch b{};
  b.seg = seg.data();
  b.tseg = tseg.data();
  b.nseg = nseg;
  b.maxlen = maxlen;
  b.layer = 0;
  const size_t need = (ASYNC ? 2 : 1) * kr_tile_floats(8 * MM, TT, KR8_COLS);
  CHECK(need <= sizeof emu_smem_buf / sizeof *emu_smem_buf, "shared memory of the emulation too small");
  return emu_launch(dim3(H, (8 * MM + KR8_COLS - 1) / KR8_COLS, nseg), dim3(kr8_threads<C, LP>()), [&] {
    kda_recur8_k<MODE, MM, ASYNC, C, LP>(b, qkv, g, dtb, Al, lb, bl, H, TT, o, kr_out{});
  });
}

/* returns the prefill launch's outputs and final states (LP lanes per column) */
template <int MM, int C, int LP = 8> static std::vector<float> recur_case(const std::vector<int> &lens, float lb) {
  enum { HD = 8 * MM };
  const int H = 2, inner = H * HD, ch = 3 * inner, nseg = (int)lens.size();
  int T = 0;
  std::vector<int> t0s;
  for (int l : lens) t0s.push_back(T), T += l;
  std::vector<float> qkv, graw, blg, dtb, Al;
  kda_random_inputs(rf, T, H, HD, 0.f, qkv, graw, blg, dtb, Al);
  /* the prefill launch's inputs (kda_decay_k's expressions) and the log decay */
  std::vector<float> dec(graw.size()), lg(graw.size()), beta(blg.size());
  for (size_t i = 0; i < graw.size(); i++) {
    const int c = (int)(i % inner);
    lg[i] = kda_gate1(graw[i], dtb.data(), Al.data(), c / HD, c, lb);
    dec[i] = expf(lg[i]);
  }
  for (size_t i = 0; i < blg.size(); i++) beta[i] = sigm(blg[i]);
  const size_t ns = (size_t)H * HD * HD;
  std::vector<float> S0((size_t)nseg * ns);
  for (auto &x : S0) x = 0.2f * rf();

  /* CPU reference (state [i][j] in kda_step, [j][i] here) */
  std::vector<float> Sref(S0), oref((size_t)T * inner);
  {
    std::vector<float> Sh((size_t)HD * HD);
    for (int z = 0; z < nseg; z++)
      for (int h = 0; h < H; h++) {
        float *Sg = &Sref[z * ns + (size_t)h * HD * HD];
        for (int i = 0; i < HD; i++)
          for (int j = 0; j < HD; j++) Sh[(size_t)i * HD + j] = Sg[(size_t)j * HD + i];
        for (int t = t0s[z]; t < t0s[z] + lens[z]; t++) {
          const float *row = &qkv[(size_t)t * ch];
          kda_step(Sh.data(), row + h * HD, row + inner + h * HD, row + 2 * inner + h * HD, &lg[(size_t)t * inner + h * HD],
                   beta[(size_t)t * H + h], HD, HD, &oref[(size_t)t * inner + h * HD]);
        }
        for (int i = 0; i < HD; i++)
          for (int j = 0; j < HD; j++) Sg[(size_t)j * HD + i] = Sh[(size_t)i * HD + j];
      }
  }
  auto seg_states = [&](std::vector<float> &S) {
    std::vector<float *> p;
    for (int z = 0; z < nseg; z++) p.push_back(&S[z * ns]);
    return p;
  };
  /* prefill: every segment in one launch, 7-token tiles */
  std::vector<float> S(S0), o((size_t)T * inner, NAN);
  bool ok = launch<KR_DECAY, MM, true, C, LP>(t0s, lens, seg_states(S), qkv.data(), dec.data(), nullptr, nullptr, 0.f,
                                         beta.data(), H, 7, o.data());
  /* decode: one token per launch and segment, gate and beta from the raw
   * projections (tiles of one token); and the log-decay entry */
  std::vector<float> Sd(S0), od((size_t)T * inner, NAN), Sl(S0), ol((size_t)T * inner, NAN);
  int maxlen = 0;
  for (int l : lens) maxlen = std::max(maxlen, l);
  for (int u = 0; u < maxlen && ok; u++) {
    std::vector<int> tz, lz;
    std::vector<float *> pd, pl;
    for (int z = 0; z < nseg; z++)
      if (u < lens[z]) tz.push_back(t0s[z] + u), lz.push_back(1), pd.push_back(&Sd[z * ns]), pl.push_back(&Sl[z * ns]);
    ok = launch<KR_RAW, MM, false, C, LP>(tz, lz, pd, qkv.data(), graw.data(), dtb.data(), Al.data(), lb, blg.data(), H, 1,
                                      od.data()) &&
         launch<KR_LOG, MM, true, C, LP>(tz, lz, pl, qkv.data(), lg.data(), nullptr, nullptr, 0.f, blg.data(), H, 1, ol.data());
  }
  CHECK(ok, "hd %d, %d columns per group: the emulated kernel deadlocked", HD, C);
  const double eo = rows_rel_diff(oref.data(), o.data(), 1, (int)o.size());
  const double es = rows_rel_diff(Sref.data(), S.data(), 1, (int)S.size());
  const bool bits = !memcmp(o.data(), od.data(), o.size() * 4) && !memcmp(S.data(), Sd.data(), S.size() * 4) &&
                    !memcmp(o.data(), ol.data(), o.size() * 4) && !memcmp(S.data(), Sl.data(), S.size() * 4);
  char nm[96];
  int k = snprintf(nm, sizeof nm, "hd %d, %d lanes x %d columns per group, lb %g, segments", HD, LP, C, lb);
  for (int z = 0; z < nseg && k < (int)sizeof nm - 8; z++) k += snprintf(nm + k, sizeof nm - k, " %d", lens[z]);
  CHECK(eo <= 1e-4 && es <= 1e-4, "%s: output err %.3g, state err %.3g > 1e-4", nm, eo, es);
  CHECK(bits, "%s: decode launches (raw gate / log decay) differ from the prefill launch", nm);
  printf("kda recurrence (emulated), %s: vs CPU output %.3g state %.3g (tol 1e-4); decode == prefill "
         "bitwise %s\n", nm, eo, es, bits ? "yes" : "NO");
  o.insert(o.end(), S.begin(), S.end());
  return o;
}

/* the gated norm after the recurrence, kda_out_k's warp per (token, head) */
static void out_rows(float *o, const float *z, const float *w, int T, int H, int hd, float eps, uint16_t *ob) {
  const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  if (wid < T * H) kda_out_row(o, z, w, (size_t)wid * hd, hd, eps, ob, (int)(threadIdx.x & 31));
}
/* Decode with the gated norm in the recurrence's launch (OUT: the head's
 * last block normalises; layout g4) against the recurrence then the norm:
 * the outputs (in place, and bf16 rows) and the states bitwise, the
 * counters back to zero; segments of 1, 3 and 1 tokens */
template <int MM> static void out_case(bool b16) {
  enum { HD = 8 * MM };
  const int H = 3, inner = H * HD;
  const std::vector<int> lens = {1, 3, 1}, t0s = {0, 1, 4};
  const int nseg = 3, T = 5;
  std::vector<float> qkv, graw, blg, dtb, Al, z((size_t)T * inner), nw(HD);
  kda_random_inputs(rf, T, H, HD, 0.f, qkv, graw, blg, dtb, Al);
  for (auto &x : z) x = 2 * rf();
  for (auto &x : nw) x = 1 + 0.3f * rf();
  const size_t ns = (size_t)H * HD * HD;
  std::vector<float> S0((size_t)nseg * ns);
  for (auto &x : S0) x = 0.2f * rf();
  std::vector<float> S[2] = {S0, S0}, o[2] = {std::vector<float>((size_t)T * inner, NAN), std::vector<float>((size_t)T * inner, NAN)};
  std::vector<uint16_t> ob[2] = {std::vector<uint16_t>((size_t)T * inner, 0), std::vector<uint16_t>((size_t)T * inner, 0)};
  std::vector<unsigned> cnt((size_t)nseg * H, 0);
  bool ok = true;
  for (int v = 0; v < 2; v++) {
    std::vector<gk_lstate> ls(nseg);
    std::vector<gk_seg> seg(nseg);
    std::vector<int> tseg(T);
    for (int q = 0; q < nseg; q++) {
      memset(&ls[q], 0, sizeof ls[q]);
      ls[q].p[GK_ST_S] = &S[v][q * ns];
      seg[q] = gk_seg{&ls[q], t0s[q], lens[q], 0, 0};
      for (int u = 0; u < lens[q]; u++) tseg[t0s[q] + u] = q;
    }
    gk_batch b{};
    b.seg = seg.data(), b.tseg = tseg.data(), b.nseg = nseg, b.maxlen = 3, b.layer = 0;
    uint16_t *obp = b16 ? ob[v].data() : nullptr;
    const dim3 grid(H, (HD + KR8_COLS - 1) / KR8_COLS, nseg);
    if (v == 0) {
      ok = ok && emu_launch(grid, dim3(kr8_threads<4, 8>()), [&] {
             kda_recur8_k<KR_RAW, MM, false, 4, 8>(b, qkv.data(), graw.data(), dtb.data(), Al.data(), -5.0f, blg.data(), H, 3,
                                                  o[0].data(), kr_out{});
           });
      ok = ok && emu_launch(dim3((T * H * 32 + 255) / 256), dim3(256),
                            [&] { out_rows(o[0].data(), z.data(), nw.data(), T, H, HD, 1e-5f, obp); });
    } else {
      const kr_out ko = {z.data(), nw.data(), obp, cnt.data(), 1e-5f};
      ok = ok && emu_launch(grid, dim3(kr8_threads<4, 8>()), [&] {
             kda_recur8_k<KR_RAW, MM, false, 4, 8, true>(b, qkv.data(), graw.data(), dtb.data(), Al.data(), -5.0f, blg.data(),
                                                        H, 3, o[1].data(), ko);
           });
    }
  }
  bool zero = true;
  for (unsigned c : cnt) zero = zero && c == 0;
  const bool bits = ok && !memcmp(o[0].data(), o[1].data(), o[0].size() * 4) && S[0] == S[1] && ob[0] == ob[1] && zero;
  CHECK(bits, "hd %d%s: the recurrence with the gated norm differs from the two launches (counters reset %d)", HD,
        b16 ? ", bf16 rows" : "", zero);
  printf("kda recurrence + gated norm in one launch (emulated), hd %d, segments 1 3 1%s: outputs and states bitwise as "
         "the two launches %s\n", HD, b16 ? ", bf16 rows" : "", bits ? "yes" : "NO");
}

int main() {
  const std::vector<int> l1 = {45, 1, 20}, l2 = {30}, l3 = {9, 16};
  /* the model's hd 128 with 4 (the default), 2 and 1 columns per group on
   * the same inputs: the same reduction pairs, so the same bits (layouts
   * g4, g2, g1 are interchangeable) */
  std::vector<float> r[3];
  for (int v = 0; v < 3; v++) {
    rf.s = SEED;
    r[v] = v == 0 ? recur_case<16, 4>(l1, -5.0f) : v == 1 ? recur_case<16, 2>(l1, -5.0f) : recur_case<16, 1>(l1, -5.0f);
  }
  CHECK(r[0] == r[1] && r[0] == r[2], "hd 128: 4, 2 and 1 columns per group give different bits");
  /* 16 lanes per column (x4, x2) and 32 (y4): the same sums, so g4's bits, at hd 128 and 64 */
  for (int v = 0; v < 3; v++) {
    rf.s = SEED;
    const std::vector<float> x = v == 0   ? recur_case<16, 4, 16>(l1, -5.0f)
                                 : v == 1 ? recur_case<16, 2, 16>(l1, -5.0f)
                                          : recur_case<16, 4, 32>(l1, -5.0f);
    CHECK(x == r[0], "hd 128: %d lanes x %d columns per group differ from g4's bits", v == 2 ? 32 : 16, v == 1 ? 2 : 4);
  }
  {
    rf.s = SEED ^ 1;
    const std::vector<float> g8 = recur_case<8, 4>(l3, NAN);
    rf.s = SEED ^ 1;
    const std::vector<float> x8 = recur_case<8, 4, 16>(l3, NAN);
    rf.s = SEED ^ 1;
    const std::vector<float> x2 = recur_case<8, 2, 16>(l3, NAN);
    CHECK(g8 == x8 && g8 == x2, "hd 64: 16 lanes per column differ from g4's bits");
  }
  recur_case<16, 1>(l2, -5.0f);
  recur_case<16, 4>(l3, -5.0f);
  recur_case<8, 2>(l1, NAN); /* hd 64 (a block's columns past hd), the softplus gate */
  recur_case<8, 4>(l2, -5.0f);
  recur_case<4, 1>(l3, -5.0f); /* hd 32 */
  recur_case<4, 2>(l2, NAN);
  recur_case<4, 4>(l1, -5.0f);
  out_case<16>(false);
  out_case<16>(true);
  out_case<8>(false);
  out_case<4>(true);
  TEST_DONE();
}
