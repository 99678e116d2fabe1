/* Fused MLA attention microbenchmark (docs/gpu.md, MLA prefill): the
 * per-head form's fused kernel (gk_mla_flash) at the model's shape: 64
 * heads, nope = vd = 256, one 4096-token chunk from position 0, pools of 4,
 * top 512 pools (2048 rows) for tokens past the dense prefix (random pools,
 * the tail always selected), as a 4096-token prefill runs it per MLA layer.
 * Median of 5 launches (events on the compute stream), ms and TFLOP/s of
 * the split-bf16 products over the causal keys (scores 2 x nope, output 3 x
 * vd multiply-adds per token, key and head); every form the build has: the
 * warpgroup (wgmma) kernel, the same with stages left out (timing
 * diagnostics: their results are wrong; the differences place the time),
 * the mma.sync kernel with 32- and 64-key tiles; the warpgroup kernel's
 * blocks in groups of 4, 8, 16 heads (gk_set_mla_flash_wg_hg), and its
 * 32-key tiles in two stages (gk_set_mla_flash_wg_bn). Each form
 * that computes the attention prints its largest difference from float64
 * on 48 sampled (token, head) rows (relative to the row's largest value;
 * expect ~1e-5) and from the first form. Usage: gpu_mla [T] [form]
 * (form: run only the warpgroup kernel with these diagnostic bits, for a
 * profiler). */
#include "core/util.h"
#include "gpu/kernels/gk.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpf(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* the float64 attention of token t, head h (its selected rows: dense, or
 * the K pools plus the tail) into ref[vd]: the forms' outputs are checked
 * against it on sampled rows, so a form that differs from the first one
 * says which of them is off */
static void ref_row(const uint16_t *q, const uint16_t *kv, const int *hd, const int *ht, const int *hp, int t, int h,
                    int H, int nope, int vd, int P, int K, double scale, double *ref) {
  const int ldh = 2 * (nope + vd);
  int n = 0, *rows = malloc((size_t)(t + 1 + K * P) * sizeof(int));
  double *sc = malloc((size_t)(t + 1 + K * P) * sizeof(double)), mx = -INFINITY, z = 0;
  if (!rows || !sc) exit(1);
  if (hd[t])
    for (int j = 0; j <= t; j++) rows[n++] = j;
  else {
    for (int i = 0; i < K; i++)
      for (int u = 0; u < P; u++) rows[n++] = hp[(size_t)t * K + i] * P + u;
    for (int j = ht[t]; j <= t; j++) rows[n++] = j;
  }
  for (int s = 0; s < n; s++) {
    const uint16_t *kr = kv + ((size_t)rows[s] * H + h) * ldh, *qr = q + ((size_t)t * H + h) * nope;
    double a = 0;
    for (int c = 0; c < nope; c++)
      a += (double)bf16_to_f32(qr[c]) * ((double)bf16_to_f32(kr[c]) + bf16_to_f32(kr[nope + c]));
    sc[s] = a * scale;
    mx = fmax(mx, sc[s]);
  }
  for (int d = 0; d < vd; d++) ref[d] = 0;
  for (int s = 0; s < n; s++) {
    const uint16_t *vr = kv + ((size_t)rows[s] * H + h) * ldh + 2 * nope;
    const double e = exp(sc[s] - mx);
    z += e;
    for (int d = 0; d < vd; d++) ref[d] += e * ((double)bf16_to_f32(vr[d]) + bf16_to_f32(vr[vd + d]));
  }
  for (int d = 0; d < vd; d++) ref[d] /= z;
  free(rows);
  free(sc);
}

int main(int argc, char **argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 4096, only = argc > 2 ? atoi(argv[2]) : -1;
  const int H = 64, nope = 256, vd = 256, P = 4, K = 512, ldh = 2 * (nope + vd);
  gk_devinfo di;
  if (T < 1 || gk_init(&di)) {
    fprintf(stderr, "gpu_mla: %s\n", T < 1 ? "bad T" : gk_error());
    return 1;
  }
  printf("device: %s, %d SMs\n", di.name, di.sm_count);
  if (!gk_mla_flash_fits(nope, vd, P)) {
    fprintf(stderr, "gpu_mla: the fused kernel is not in this build\n");
    return 1;
  }
  const int nw = gk_mla_flash_map_words(T, P);
  uint16_t *Q16 = gk_malloc((size_t)T * H * nope * 2), *KV3 = gk_malloc((size_t)T * H * ldh * 2);
  int *dense = gk_malloc((size_t)T * 4), *npools = gk_malloc((size_t)T * 4), *tail = gk_malloc((size_t)T * 4);
  int *pools = gk_malloc((size_t)T * K * 4), *dpos = gk_malloc(4);
  uint32_t *map = gk_malloc((size_t)T * nw * 4);
  float *out = gk_malloc((size_t)T * H * vd * 4);
  int *hd = malloc((size_t)T * 4), *hn = malloc((size_t)T * 4), *ht = malloc((size_t)T * 4);
  int *hp = calloc((size_t)T * K, 4);
  if (!Q16 || !KV3 || !dense || !npools || !tail || !pools || !dpos || !map || !out || !hd || !hn || !ht || !hp) {
    fprintf(stderr, "gpu_mla: %s\n", gk_error());
    return 1;
  }
  /* bf16 noise in [-2, 2] for q; K and V uniform in [-2, 2] split as the
   * GEMM form splits them (hi = bf16(x), lo = bf16(x - hi)): with lo as
   * large as hi (as the first version of this bench filled them) the
   * dropped P lo . V lo term alone put every form ~1e-3 from float64. The
   * scale keeps the softmax from saturating: a row's scores spread over a
   * few units. */
  gk_fill_random(Q16, (size_t)T * H * nope * 2, 1);
  uint16_t *hkv = malloc((size_t)T * H * ldh * 2);
  if (!hkv) return 1;
  unsigned rng = 12345u;
  for (size_t r = 0; r < (size_t)T * H; r++)
    for (int part = 0; part < 2; part++) { /* K, V */
      const int w = part ? vd : nope;
      uint16_t *row = hkv + r * ldh + (part ? 2 * nope : 0);
      for (int c = 0; c < w; c++) {
        rng = rng * 1664525u + 1013904223u;
        const float x = ((float)(rng >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f;
        row[c] = f32_to_bf16(x);
        row[w + c] = f32_to_bf16(x - bf16_to_f32(row[c]));
      }
    }
  if (gk_h2d(KV3, hkv, (size_t)T * H * ldh * 2)) {
    fprintf(stderr, "gpu_mla: %s\n", gk_error());
    return 1;
  }
  for (int t = 0; t < T; t++) {
    const int np = (t + 1 + P - 1) / P; /* pools up to the token's own */
    hd[t] = t + 1 <= K * P;
    ht[t] = (t / P) * P; /* the token's own pool: always selected */
    hn[t] = hd[t] ? 0 : K;
    int *sel = hp + (size_t)t * K;
    if (hd[t]) continue;
    /* K distinct pools of the np - 1 before the tail (a partial shuffle) */
    int *idx = malloc((size_t)np * sizeof(int));
    for (int i = 0; i < np - 1; i++) idx[i] = i;
    for (int i = 0; i < K; i++) {
      rng = rng * 1664525u + 1013904223u;
      const int j = i + (int)((rng >> 8) % (unsigned)(np - 1 - i));
      const int x = idx[i];
      idx[i] = idx[j];
      idx[j] = x;
      sel[i] = idx[i];
    }
    free(idx);
  }
  const int zero = 0;
  gk_h2d(dense, hd, (size_t)T * 4);
  gk_h2d(npools, hn, (size_t)T * 4);
  gk_h2d(tail, ht, (size_t)T * 4);
  gk_h2d(pools, hp, (size_t)T * K * 4);
  gk_h2d(dpos, &zero, 4);
  const double flop = 2.0 * T * (T + 1) / 2 * H * (2.0 * nope + 3.0 * vd);
  /* float64 references of 48 sampled (token, head) rows: the first and
   * last tokens, both sides of the dense prefix's end, random ones */
  enum { NS = 48 };
  int st[NS], sh[NS];
  double *sref = malloc((size_t)NS * vd * sizeof(double));
  {
    uint16_t *hq = malloc((size_t)T * H * nope * 2);
    if (!sref || !hq || gk_d2h(hq, Q16, (size_t)T * H * nope * 2)) {
      fprintf(stderr, "gpu_mla: %s\n", gk_error());
      return 1;
    }
    const int fixed[] = {0, 1, K * P - 2, K * P - 1, K * P, K * P + 1, T / 2, T - 1};
    for (int i = 0; i < NS; i++) {
      rng = rng * 1664525u + 1013904223u;
      st[i] = i < 8 ? fixed[i] : (int)((rng >> 8) % (unsigned)T);
      if (st[i] >= T) st[i] = T - 1;
      sh[i] = (i * 37) % H;
      ref_row(hq, hkv, hd, ht, hp, st[i], sh[i], H, nope, vd, P, K, 0.0625, sref + (size_t)i * vd);
    }
    free(hq);
    free(hkv);
  }
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  /* bn: keys per tile (the warpgroup kernel: 64 one stage, 32 two stages) */
  static const struct { const char *name; int wg, bn, dg, hg; } form[] = {
      {"wgmma, one head's blocks after another", 1, 64, 0, 1},
      {"wgmma, blocks in groups of 4 heads (the default)", 1, 64, 0, 4},
      {"wgmma, blocks in groups of 8 heads", 1, 64, 0, 8},
      {"wgmma, blocks in groups of 16 heads", 1, 64, 0, 16},
      {"wgmma, no K/V copies after the first tile", 1, 64, 1, 1},
      {"wgmma, no score products", 1, 64, 2, 1},
      {"wgmma, no output products", 1, 64, 4, 1},
      {"wgmma, no products", 1, 64, 6, 1},
      {"wgmma, no mask / softmax", 1, 64, 8, 1},
      {"wgmma, products only (no copies, no softmax)", 1, 64, 9, 1},
      {"wgmma, copies only", 1, 64, 14, 1},
      {"wgmma, loop only (barriers, first tile)", 1, 64, 15, 1},
      {"wgmma, next K tile right after the scores (A/B)", 1, 64, 16, 4},
      {"wgmma 32-key tiles in two stages, groups of 4", 1, 32, 0, 4},
      {"wgmma 32-key two stages, one head after another", 1, 32, 0, 1},
      {"wgmma 32-key two stages, no K/V copies", 1, 32, 1, 1},
      {"wgmma 32-key two stages, products only", 1, 32, 9, 1},
      {"wgmma 32-key two stages, copies only", 1, 32, 14, 1},
      {"mma.sync, 32-key tiles", 0, 32, 0, 1},
      {"mma.sync, 64-key tiles", 0, 64, 0, 1},
  };
  printf("fused MLA attention, T %d, H %d, nope %d, vd %d, pools of %d, top %d pools; %.2f TFLOP of split products:\n", T,
         H, nope, vd, P, K, flop * 1e-12);
  int bad = 0, have0 = 0;
  float *h0 = malloc((size_t)T * H * vd * 4), *ho = malloc((size_t)T * H * vd * 4);
  if (!h0 || !ho) return 1;
  for (size_t f = 0; f < sizeof form / sizeof form[0]; f++) {
    if (only >= 0 && (!form[f].wg || form[f].dg != only || form[f].hg != 1)) continue;
    gk_set_mla_flash_wg(form[f].wg);
    gk_set_mla_flash_wg_bn(form[f].wg ? form[f].bn : -1);
    gk_set_mla_flash_bn(form[f].wg ? -1 : form[f].bn);
    gk_set_mla_flash_wg_hg(form[f].hg ? form[f].hg : 1);
    if (form[f].wg && (!gk_mla_flash_wg() || gk_set_mla_flash_wg_diag(form[f].dg))) {
      printf("  %-48s not in this build or device\n", form[f].name);
      continue;
    }
    float ms[5];
    for (int r = 0; r < 6; r++) { /* the first one warms up */
      gk_event_record(e0);
      bad |= gk_mla_flash(Q16, KV3, dense, npools, tail, pools, K, dpos, T, H, nope, vd, P, T, 0.0625f, map, out) != 0;
      gk_event_record(e1);
      const float t = gk_event_ms(e0, e1);
      if (r) ms[r - 1] = t;
    }
    qsort(ms, 5, sizeof *ms, cmpf);
    /* the forms that compute the same output: the largest difference from
     * the first one's (the block order changes no bits; the mma.sync
     * kernel sums in another order) */
    char cmp[128] = "";
    if (!(form[f].dg & 15)) { /* 16: the same results */
      bad |= gk_d2h(ho, out, (size_t)T * H * vd * 4);
      double e64 = 0; /* vs float64: the largest |diff| / the row's largest |ref| */
      for (int i = 0; i < NS; i++) {
        double dm = 0, rm = 0;
        for (int d = 0; d < vd; d++) {
          dm = fmax(dm, fabs(ho[((size_t)st[i] * H + sh[i]) * vd + d] - sref[(size_t)i * vd + d]));
          rm = fmax(rm, fabs(sref[(size_t)i * vd + d]));
        }
        e64 = fmax(e64, dm / (rm > 0 ? rm : 1));
      }
      snprintf(cmp, sizeof cmp, "  vs float64 %.3g", e64);
      if (!have0) {
        memcpy(h0, ho, (size_t)T * H * vd * 4);
        have0 = 1;
      } else {
        double d = 0;
        for (size_t i = 0; i < (size_t)T * H * vd; i++) d = fmax(d, fabs((double)ho[i] - h0[i]));
        snprintf(cmp + strlen(cmp), sizeof cmp - strlen(cmp), ", max |diff| from the first %.3g", d);
      }
    }
    printf("  %-48s %8.3f ms  %6.1f TFLOP/s%s\n", form[f].name, ms[2], flop / (ms[2] * 1e9), cmp);
  }
  gk_set_mla_flash_wg_diag(0);
  gk_set_mla_flash_wg_hg(-1);
  gk_set_mla_flash_wg(-1);
  gk_set_mla_flash_wg_bn(-1);
  gk_set_mla_flash_bn(-1);
  free(h0);
  free(ho);
  free(sref);
  free(hd);
  free(hn);
  free(ht);
  free(hp);
  if (bad || gk_sync()) fprintf(stderr, "gpu_mla: %s\n", gk_error());
  return bad;
}
