/* The kernels that address the paged indexer states (src/gpu/kernels/
 * gk_dsa.cuh) run on the host through the CUDA emulator: a segment that
 * starts inside a pool stores its keys and gate logits (store_at_k) into
 * 4-row pages whose table is in reverse order, completes three pools
 * (pool_keys_k) and scores every complete pool for the tokens that see more
 * than K (idx_scores_k), against float64 references computed from the
 * source rows (not from the pages, so a row stored to the wrong place
 * shows). Rows and pooled keys exact where copied, 1e-6 relative
 * elsewhere; tokens with K or fewer pools keep their (NaN) scores. */
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
  TEST_DONE();
}
