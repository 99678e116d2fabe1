/* KDA recurrence microbenchmark (docs/gpu.md, KDA): gk_kda_recur_gated at
 * the full model's shape (64 heads of 128, one 4096-token sequence; the
 * gate with the config's lower bound -5) in each layout of the token
 * kernel (GLM53_GPU_KDA_LAYOUT: 8 lanes per column with 1, 2 or 4 columns
 * per lane group, 16 lanes per column with 2 or 4, 32 lanes with 4 in the
 * same tree (y4), 32 lanes per column with 4 or 8 per warp). Each layout's
 * outputs of one launch from the same state are compared with g4's bit for
 * bit (x2, x4 and y4 promise g4's bits;
 * the others sum in another order). Median of 5 launches (events on the compute
 * stream), ms per launch and G state-element updates per second (T * H *
 * hd^2 / time; each update is 4 floating-point operations). The decay
 * pass (kda_decay) is part of every launch. Usage: gpu_kda [T] */
#include "gpu/kernels/gk.h"
#include "core/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpf(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 4096, H = 64, hd = 128, inner = H * hd;
  gk_devinfo di;
  if (T < 1 || gk_init(&di)) {
    fprintf(stderr, "gpu_kda: %s\n", T < 1 ? "bad T" : gk_error());
    return 1;
  }
  printf("device: %s, %d SMs\n", di.name, di.sm_count);
  float *qkv = gk_malloc((size_t)T * 3 * inner * 4), *graw = gk_malloc((size_t)T * inner * 4);
  float *g = gk_malloc((size_t)T * inner * 4), *bl = gk_malloc((size_t)T * H * 4), *blraw = gk_malloc((size_t)T * H * 4), *o = gk_malloc((size_t)T * inner * 4);
  float *dtb = gk_malloc(inner * 4), *Al = gk_malloc(H * 4), *S = gk_malloc((size_t)H * hd * hd * 4);
  if (!qkv || !graw || !g || !bl || !blraw || !o || !dtb || !Al || !S) {
    fprintf(stderr, "gpu_kda: %s\n", gk_error());
    return 1;
  }
  /* bf16-pair noise in [-2, 2]: q, k, v, state O(1); the gates spread over (-5, 0) */
  gk_fill_random(qkv, (size_t)T * 3 * inner * 4, 1);
  gk_fill_random(graw, (size_t)T * inner * 4, 2);
  gk_fill_random(blraw, (size_t)T * H * 4, 3);
  gk_fill_random(dtb, inner * 4, 4);
  gk_fill_random(Al, H * 4, 5);
  gk_fill_random(S, (size_t)H * hd * hd * 4, 6);
  gk_seg seg = {.t0 = 0, .len = T, .pos0 = 0};
  gk_lstate ls;
  memset(&ls, 0, sizeof ls);
  ls.p[GK_ST_S] = S;
  gk_lstate *dls = gk_malloc(sizeof ls);
  gk_h2d(dls, &ls, sizeof ls);
  seg.ls = dls;
  gk_seg *dseg = gk_malloc(sizeof seg);
  gk_h2d(dseg, &seg, sizeof seg);
  int *tseg = gk_malloc((size_t)T * 4);
  gk_memset(tseg, 0, (size_t)T * 4);
  gk_batch b = {.seg = dseg, .tseg = tseg, .nseg = 1, .maxlen = T};
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  static const struct { const char *name; int layout; } form[] = {
      {"g4: 8 lanes per column, 4 per group (the default)", GK_KR_G4},
      {"g2: 8 lanes per column, 2 per group", GK_KR_G2},
      {"g1: 8 lanes per column, 1 per group", GK_KR_G1},
      {"w4: 32 lanes per column, 4 per warp", GK_KR_W4},
      {"w8: 32 lanes per column, 8 per warp", GK_KR_W8},
      {"x4: 16 lanes per column, 4 per group", GK_KR_X4},
      {"x2: 16 lanes per column, 2 per group", GK_KR_X2},
      {"y4: 32 lanes per column, 4 per group", GK_KR_Y4},
  };
  float *S0 = gk_malloc((size_t)H * hd * hd * 4), *h0 = malloc((size_t)T * inner * 4), *ho = malloc((size_t)T * inner * 4);
  if (!S0 || !h0 || !ho) {
    fprintf(stderr, "gpu_kda: out of memory\n");
    return 1;
  }
  gk_d2d(S0, S, (size_t)H * hd * hd * 4);
  printf("KDA recurrence, H %d, hd %d, T %d, lower bound -5:\n", H, hd, T);
  int bad = 0;
  for (size_t f = 0; f < sizeof form / sizeof form[0]; f++) {
    gk_set_kda_layout(form[f].layout);
    /* one launch from the initial state: the bits against g4's */
    gk_d2d(S, S0, (size_t)H * hd * hd * 4);
    gk_d2d(g, graw, (size_t)T * inner * 4);
    gk_d2d(bl, blraw, (size_t)T * H * 4);
    bad |= gk_kda_recur_gated(&b, qkv, g, dtb, Al, -5.0f, bl, T, H, hd, o) || gk_d2h(f ? ho : h0, o, (size_t)T * inner * 4);
    const char *bits = !f ? "" : memcmp(ho, h0, (size_t)T * inner * 4) ? "  other bits than g4" : "  g4's bits";
    float ms[5];
    for (int r = 0; r < 6; r++) { /* the first one warms up */
      /* the launch overwrites the gate with the decay and beta's logits with beta */
      gk_d2d(g, graw, (size_t)T * inner * 4);
      gk_d2d(bl, blraw, (size_t)T * H * 4);
      gk_event_record(e0);
      bad |= gk_kda_recur_gated(&b, qkv, g, dtb, Al, -5.0f, bl, T, H, hd, o);
      gk_event_record(e1);
      const float t = gk_event_ms(e0, e1);
      if (r) ms[r - 1] = t;
    }
    qsort(ms, 5, sizeof *ms, cmpf);
    printf("  %-52s %8.3f ms  %7.1f G updates/s%s\n", form[f].name, ms[2], (double)T * H * hd * hd / (ms[2] * 1e6), bits);
  }
  gk_set_kda_layout(0);
  free(h0);
  free(ho);
  if (bad || gk_sync()) fprintf(stderr, "gpu_kda: %s\n", gk_error());
  return bad;
}
