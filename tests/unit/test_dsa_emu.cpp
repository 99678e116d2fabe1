/* The kernels that address the paged indexer states (src/gpu/kernels/
 * gk_dsa.cuh) run on the host through the CUDA emulator: a segment that
 * starts inside a pool stores its keys and gate logits (store_at_k) into
 * 4-row pages whose table is in reverse order, completes three pools
 * (pool_keys_k) and scores every complete pool for the tokens that see more
 * than K (idx_scores_k), against float64 references computed from the
 * source rows (not from the pages, so a row stored to the wrong place
 * shows). Rows and pooled keys exact where copied, 1e-6 relative
 * elsewhere; tokens with K or fewer pools keep their (NaN) scores. Then
 * the decode launches that fuse these steps (idx_keys_k: key norm, both
 * stores and the pooling; rmsnorm2_k storing the latent rows) against the
 * separate kernels, bitwise, on three one-token segments. */
#include "emu/cuda_emu.h"
extern "C" {
#include "gpu/kernels/gk.h"
}
#include "test_util.h"
#include <string.h>

#include "gpu/kernels/gk_device.cuh"
#include "gpu/kernels/gk_dsa.cuh"

static uint64_t g_s = 0x13198a2e03707344ull;
static float rf() {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return (float)((g_s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* a paged state of `rows` rows of hd floats, pages of 4 rows in reverse */
struct paged {
  std::vector<std::vector<float>> pages;
  std::vector<float *> table;
  paged(int rows, int hd) {
    const int np = (rows + 3) / 4;
    pages.assign(np, std::vector<float>((size_t)4 * hd, NAN));
    for (int p = 0; p < np; p++) table.push_back(pages[np - 1 - p].data());
  }
  float *row(int r, int hd) { return table[r >> 2] + (size_t)(r & 3) * hd; }
};

/* the layernorm_k / rmsnorm_k bodies (gk_layers.cu) on row blockIdx.x */
static void ln_rows(float *y, const float *x, const float *w, const float *b, int n, float eps) {
  __shared__ float sh[32];
  layernorm_row(y + (size_t)blockIdx.x * n, x + (size_t)blockIdx.x * n, w, b, n, eps, sh);
}

/* Decode: three one-token segments (positions 11 and 15 complete a pool, 5
 * does not), each with its own pages; the fused launches against
 * layernorm + store_at x 2 + pool_keys and rmsnorm2 + store_at on a copy
 * of the same state: every page and output bitwise equal. */
static void fused_decode_case() {
  const int hd = 32, P = 4, kl = 24, ql = 20, T = 3, rows = 16, pos[T] = {11, 5, 15};
  std::vector<float> ape((size_t)P * hd), knw(hd), knb(hd), qw(ql), kw(kl);
  for (auto &x : ape) x = rf();
  for (auto &x : knw) x = 1 + 0.5f * rf();
  for (auto &x : knb) x = 0.2f * rf();
  for (auto &x : qw) x = 1 + 0.5f * rf();
  for (auto &x : kw) x = 1 + 0.5f * rf();
  std::vector<float> kk0((size_t)T * hd), kg((size_t)T * hd), r0((size_t)T * ql), ckv0((size_t)T * kl);
  for (auto &x : kk0) x = 3 * rf() + 0.5f;
  for (auto &x : kg) x = 2 * rf();
  for (auto &x : r0) x = 2 * rf();
  for (auto &x : ckv0) x = 2 * rf();
  struct side { /* one run's states: per segment IK, IS, POOL, LATENT */
    std::vector<paged> ik, is, pool, lat;
    std::vector<gk_lstate> ls;
    std::vector<float> kk, r, ckv;
  } s[2];
  for (auto &x : s) {
    for (int q = 0; q < T; q++) {
      x.ik.emplace_back(rows, hd), x.is.emplace_back(rows, hd), x.pool.emplace_back(rows / P, hd), x.lat.emplace_back(rows, kl);
    }
    x.ls.resize(T);
    x.kk = kk0, x.r = r0, x.ckv = ckv0;
  }
  g_s = 0x243f6a8885a308d3ull; /* the earlier rows: the same random values in both runs */
  for (auto &x : s) {
    const uint64_t seed = g_s;
    for (int q = 0; q < T; q++) {
      for (int r = 0; r < pos[q]; r++)
        for (int c = 0; c < hd; c++) x.ik[q].row(r, hd)[c] = rf(), x.is[q].row(r, hd)[c] = 2 * rf();
      memset(&x.ls[q], 0, sizeof x.ls[q]);
      x.ls[q].pg[GK_ST_IK] = x.ik[q].table.data();
      x.ls[q].pg[GK_ST_IS] = x.is[q].table.data();
      x.ls[q].pg[GK_ST_POOL] = x.pool[q].table.data();
      x.ls[q].pg[GK_ST_LATENT] = x.lat[q].table.data();
      x.ls[q].pshift = 2;
    }
    g_s = seed;
  }
  bool ok = true;
  for (int v = 0; v < 2; v++) {
    side &x = s[v];
    std::vector<gk_seg> seg(T);
    std::vector<int> tseg(T);
    for (int q = 0; q < T; q++) seg[q] = {&x.ls[q], q, 1, pos[q], 0}, tseg[q] = q;
    gk_batch b{};
    b.seg = seg.data();
    b.tseg = tseg.data();
    b.nseg = T;
    b.maxlen = 1;
    gk_norm_rows na = {x.r.data(), ql, x.r.data(), ql, qw.data(), ql}, nb = {x.ckv.data(), kl, x.ckv.data(), kl, kw.data(), kl};
    if (v == 0) {
      ok = ok && emu_launch(dim3(T), dim3(256), [&] { ln_rows(x.kk.data(), x.kk.data(), knw.data(), knb.data(), hd, 1e-6f); });
      ok = ok && emu_launch(dim3((T * hd + 255) / 256), dim3(256), [&] { store_at_k(b, GK_ST_IK, hd, x.kk.data(), T, hd); });
      ok = ok && emu_launch(dim3((T * hd + 255) / 256), dim3(256), [&] { store_at_k(b, GK_ST_IS, hd, kg.data(), T, hd); });
      ok = ok && emu_launch(dim3((1 / P + 1) * hd / 256 + 1, T), dim3(256), [&] { pool_keys_k(b, ape.data(), P, hd); });
      ok = ok && emu_launch(dim3(2 * T), dim3(256), [&] { rmsnorm2_k(na, nb, T, 1e-5f, gk_batch{}, -1, 0); });
      ok = ok && emu_launch(dim3((T * kl + 255) / 256), dim3(256), [&] { store_at_k(b, GK_ST_LATENT, kl, x.ckv.data(), T, kl); });
    } else {
      ok = ok && emu_launch(dim3(T), dim3(256), [&] {
             idx_keys_k(b, x.kk.data(), kg.data(), knw.data(), knb.data(), ape.data(), P, hd, 1e-6f);
           });
      ok = ok && emu_launch(dim3(2 * T), dim3(256), [&] { rmsnorm2_k(na, nb, T, 1e-5f, b, GK_ST_LATENT, kl); });
    }
  }
  bool same = ok && s[0].kk == s[1].kk && s[0].r == s[1].r && s[0].ckv == s[1].ckv;
  int pools = 0;
  for (int q = 0; q < T && same; q++) {
    for (int r = 0; r <= pos[q]; r++)
      same = same && !memcmp(s[0].ik[q].row(r, hd), s[1].ik[q].row(r, hd), hd * 4) &&
             !memcmp(s[0].is[q].row(r, hd), s[1].is[q].row(r, hd), hd * 4);
    same = same && !memcmp(s[0].lat[q].row(pos[q], kl), s[1].lat[q].row(pos[q], kl), kl * 4) &&
           !memcmp(s[0].lat[q].row(pos[q], kl), s[0].ckv.data() + (size_t)q * kl, kl * 4);
    for (int p = 0; p < rows / P; p++) { /* NaN (untouched) in both, or the same bits */
      same = same && !memcmp(s[0].pool[q].row(p, hd), s[1].pool[q].row(p, hd), hd * 4);
      pools += (pos[q] + 1) % P == 0 && p == pos[q] / P && !isnan(s[1].pool[q].row(p, hd)[0]);
    }
  }
  CHECK(same && pools == 2, "fused decode launches: differ from the separate kernels (pools written %d of 2)", pools);
  printf("indexer keys + stores + pooling, and norms + latent store (emulated, 3 one-token segments): bitwise as the "
         "separate kernels %s, pools completed %d of 2\n", same ? "yes" : "NO", pools);
}

int main() {
  const int hd = 32, P = 4, nh = 8, K = 2, pos0 = 13, T = 11, rows = pos0 + T, npool = rows / P, maxpool = npool;
  paged ik(rows, hd), is(rows, hd), pool(npool, hd);
  std::vector<float> IK((size_t)rows * hd), IS((size_t)rows * hd), POOL((size_t)npool * hd), ape((size_t)P * hd);
  for (auto &x : IK) x = rf();
  for (auto &x : IS) x = 2 * rf();
  for (auto &x : ape) x = rf();
  /* the context before the segment is already in the pages, with its pools */
  for (int r = 0; r < pos0; r++) {
    memcpy(ik.row(r, hd), &IK[(size_t)r * hd], hd * sizeof(float));
    memcpy(is.row(r, hd), &IS[(size_t)r * hd], hd * sizeof(float));
  }
  for (int p = 0; p < npool; p++)
    for (int c = 0; c < hd; c++) {
      double mx = -INFINITY, z = 0, acc = 0;
      for (int m = 0; m < P; m++) mx = fmax(mx, (double)IS[(size_t)(p * P + m) * hd + c] + ape[m * hd + c]);
      for (int m = 0; m < P; m++) z += exp((double)IS[(size_t)(p * P + m) * hd + c] + ape[m * hd + c] - mx);
      for (int m = 0; m < P; m++)
        acc += exp((double)IS[(size_t)(p * P + m) * hd + c] + ape[m * hd + c] - mx) / z * IK[(size_t)(p * P + m) * hd + c];
      POOL[(size_t)p * hd + c] = (float)acc;
    }
  for (int p = 0; p < pos0 / P; p++) memcpy(pool.row(p, hd), &POOL[(size_t)p * hd], hd * sizeof(float));
  gk_lstate ls;
  memset(&ls, 0, sizeof ls);
  ls.pg[GK_ST_IK] = ik.table.data();
  ls.pg[GK_ST_IS] = is.table.data();
  ls.pg[GK_ST_POOL] = pool.table.data();
  ls.pshift = 2;
  gk_seg seg = {&ls, 0, T, pos0, 0};
  std::vector<int> tseg(T, 0);
  gk_batch b{};
  b.seg = &seg;
  b.tseg = tseg.data();
  b.nseg = 1;
  b.maxlen = T;
  /* 1. the segment's rows */
  bool ok = true;
  for (int which : {GK_ST_IK, GK_ST_IS}) {
    const float *src = &(which == GK_ST_IK ? IK : IS)[(size_t)pos0 * hd];
    ok = ok && emu_launch(dim3((T * hd + 255) / 256), dim3(256), [&] { store_at_k(b, which, hd, src, T, hd); });
  }
  bool rows_ok = true;
  for (int r = 0; r < rows; r++)
    rows_ok = rows_ok && !memcmp(ik.row(r, hd), &IK[(size_t)r * hd], hd * 4) && !memcmp(is.row(r, hd), &IS[(size_t)r * hd], hd * 4);
  CHECK(ok && rows_ok, "store_at: the rows in the pages differ from the source");
  /* 2. the pools the segment completes */
  ok = ok && emu_launch(dim3(((T / P + 1) * hd + 255) / 256, 1), dim3(256), [&] { pool_keys_k(b, ape.data(), P, hd); });
  double mx = 0, d = 0;
  for (int p = 0; p < npool; p++)
    for (int c = 0; c < hd; c++) {
      const double ref = POOL[(size_t)p * hd + c], got = pool.row(p, hd)[c];
      mx = fmax(mx, fabs(ref));
      d = isnan(got) ? INFINITY : fmax(d, fabs(got - ref));
    }
  CHECK(ok && d / mx <= 1e-6, "pool_keys: err %.3g", d / mx);
  printf("pooled keys (emulated) through reversed 4-row pages vs float64: err %.3g (tol 1e-6)\n", d / mx);
  /* 3. pool scores */
  std::vector<float> q((size_t)T * nh * hd), w((size_t)T * nh), score((size_t)T * maxpool, NAN);
  for (auto &x : q) x = rf();
  for (auto &x : w) x = rf();
  const size_t sm = ((size_t)nh * (hd + 1) + 8 * (size_t)hd) * sizeof(float);
  const int ppb = 8;
  ok = ok && sm <= sizeof emu_smem_buf && emu_launch(dim3(T, (maxpool + ppb - 1) / ppb), dim3(256), [&] {
         idx_scores_k(q.data(), w.data(), b, P, nh, hd, K, maxpool, ppb, score.data());
       });
  mx = 0, d = 0;
  bool untouched = true;
  for (int t = 0; t < T; t++) {
    const int n = (pos0 + t + 1) / P;
    for (int p = 0; p < maxpool; p++) {
      const float got = score[(size_t)t * maxpool + p];
      if (n <= K || p >= n) {
        untouched = untouched && isnan(got);
        continue;
      }
      double ref = 0;
      for (int h = 0; h < nh; h++) {
        double dot = 0;
        for (int c = 0; c < hd; c++) dot += (double)q[((size_t)t * nh + h) * hd + c] * POOL[(size_t)p * hd + c];
        dot /= sqrt((double)hd);
        if (dot > 0) ref += w[(size_t)t * nh + h] / sqrt((double)nh) * dot;
      }
      mx = fmax(mx, fabs(ref));
      d = isnan(got) ? INFINITY : fmax(d, fabs(got - ref));
    }
  }
  CHECK(ok && d / mx <= 1e-6 && untouched, "indexer scores: err %.3g, untouched %d", d / mx, untouched);
  printf("indexer pool scores (emulated) over the paged pooled keys vs float64: err %.3g (tol 1e-6)\n", d / mx);
  fused_decode_case();
  TEST_DONE();
}
