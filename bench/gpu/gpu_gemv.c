/* Decode GEMV microbenchmark (docs/gpu.md "Products"): the in-house GEMV of
 * gk_matmul for n < gk_gemm_min() tokens and the routed-expert pair launch
 * (gk_matmul_experts), per shape, weight format and token count, against
 * the device-to-device copy bandwidth measured in the same run.
 *
 * Timing: each configuration is captured as a CUDA graph of R launches
 * (decode replays graphs; plain launches where capture is unavailable) that
 * cycle through enough copies of the weights (>= 512 MB) to miss the 50 MB
 * L2, as a decode step does; the median of 7 replays, in us per launch.
 * GB/s counts the weight bytes (data + scales) read per launch.
 * Kernels: v3 = the default; v3 unpipelined = the same without loading the
 * next round before the FMAs (gk_set_gemv_version(4), same bits); old = the
 * default before v3 (v2 rows-per-warp kernel for bf16/f32, v1 one-row
 * kernel for Q8/Q4); v1 = the one-row kernel.
 * Checks: v3 against v1 (max |diff| / max |ref|, <= 1e-5), v3 pipelined and
 * unpipelined bitwise equal, and v3 results of a token bitwise equal
 * whatever n (token 0 and token n-1 against n = 1).
 * Tables: 1) n = 1 per shape and format; 2) routed experts, 8 pairs;
 * 3) n = 1..64, v3 GEMV vs the cuBLAS path (gk_set_gemm_min), crossover;
 * 4) n = 1 at several split-K targets (gk_set_gemv_split_target).
 * Usage: gpu_gemv [quick]   (quick: fewer shapes) */
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "model/wmat.h"
#include "core/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double g_bw;
static int g_fail;

static const char *fmt_name(int fmt, int scale_bf16) {
  switch (fmt) {
  case WMAT_F32: return "f32";
  case WMAT_BF16: return "bf16";
  case WMAT_Q8: return scale_bf16 ? "q8" : "q8/f16";
  default: return scale_bf16 ? "q4" : "q4/f16";
  }
}
static size_t data_bytes(const gpu_mat *W) {
  size_t n = (size_t)W->rows * W->cols;
  return W->fmt == WMAT_F32 ? n * 4 : W->fmt == WMAT_BF16 ? n * 2 : W->fmt == WMAT_Q8 ? n : n / 2;
}
static size_t mat_bytes(const gpu_mat *W) {
  return data_bytes(W) + (W->fmt >= WMAT_Q8 ? (size_t)W->rows * (W->cols / W->group) * 2 : 0);
}
/* a device matrix with random contents (finite for every format) */
static gpu_mat new_mat(int fmt, int rows, int cols, int group, int sbf16, unsigned seed) {
  gpu_mat W = {.fmt = fmt, .rows = rows, .cols = cols, .group = group, .scale_bf16 = sbf16};
  size_t db = (data_bytes(&W) + 255) & ~(size_t)255, nb = mat_bytes(&W) - data_bytes(&W);
  char *d = gk_malloc(db + nb + 16);
  if (!d) { fprintf(stderr, "alloc: %s\n", gk_error()); exit(1); }
  gk_fill_random(d, db + nb, seed); /* bf16 pairs in [-2, 2]: also finite as f32 and f16 */
  W.d = d;
  if (fmt >= WMAT_Q8) W.s = d + db;
  return W;
}

static int cmp_f(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* one launch of configuration `what` with copy `i` */
typedef struct {
  int kind; /* 0 gk_matmul, 1 gk_matmul_experts */
  gpu_mat *W; int ncopy;      /* kind 0 */
  const float *x; int n, ldx; float *y; int ldy;
  /* kind 1 */
  const gpu_mat *dset; int which, fmt, rows, cols; const int *const *idx; int nidx; int npairs, k, xpt;
} job;
static int launch(const job *j, int i) {
  if (j->kind == 0) return gk_matmul(&j->W[i % j->ncopy], j->x, j->n, j->ldx, j->y, j->ldy);
  return gk_matmul_experts(j->dset, j->which, j->fmt, j->rows, j->cols, j->idx[i % j->nidx], j->npairs, j->k, j->xpt, j->x,
                           j->ldx, j->y, j->ldy);
}
/* median us per launch */
static double time_job(const job *j, int R) {
  for (int i = 0; i < 3; i++) if (launch(j, i)) { fprintf(stderr, "launch: %s\n", gk_error()); exit(1); }
  gk_sync();
  void *g = NULL;
  if (gk_graphs_supported() && !gk_capture_begin()) {
    int bad = 0;
    for (int i = 0; i < R; i++) bad |= launch(j, i);
    if (gk_capture_end(&g) || bad) { g = NULL; gk_sync(); }
  }
  void *a = gk_event_new(), *b = gk_event_new();
  double t[7];
  for (int rep = -1; rep < 7; rep++) {
    gk_event_record(a);
    if (g) gk_graph_launch(g);
    else for (int i = 0; i < R; i++) launch(j, i);
    gk_event_record(b);
    double us = gk_event_ms(a, b) * 1e3 / R;
    if (rep >= 0) t[rep] = us;
  }
  gk_event_free(a); gk_event_free(b);
  if (g) gk_graph_free(g);
  if (gk_sync()) { fprintf(stderr, "timing: %s\n", gk_error()); exit(1); }
  qsort(t, 7, sizeof *t, cmp_f);
  return t[3];
}
static int reps_for(int ncopy) { return ncopy >= 8 ? ncopy : (8 + ncopy - 1) / ncopy * ncopy; }
static int copies_for(size_t bytes) {
  int c = (int)((512u << 20) / bytes) + 1;
  return c > 16 ? 16 : c;
}

static float *d2h_f(const float *d, size_t n) {
  float *h = xmalloc(n * sizeof(float));
  if (gk_d2h(h, d, n * sizeof(float))) { fprintf(stderr, "d2h: %s\n", gk_error()); exit(1); }
  return h;
}
static double rel(const float *a, const float *ref, size_t n) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < n; i++) {
    mx = fmax(mx, fabs(ref[i]));
    double e = fabs((double)a[i] - ref[i]);
    d = isnan(e) ? INFINITY : fmax(d, e);
  }
  return d / fmax(mx, 1e-30);
}

/* table 1: n = 1 */
static void shapes_n1(int quick) {
  static const int shapes[][2] = {{2048, 4096}, {4096, 2048}, {8192, 4096}, {4096, 8192}, {12288, 4096}, {154880, 4096}, {128, 4096}};
  static const int fmts[][3] = {{WMAT_BF16, 0, 1}, {WMAT_Q4, 32, 1}, {WMAT_Q8, 32, 1}, {WMAT_Q4, 64, 0}, {WMAT_Q4, 128, 1}, {WMAT_F32, 0, 1}};
  const int nshape = sizeof shapes / sizeof *shapes, nfmt = quick ? 3 : sizeof fmts / sizeof *fmts;
  float *x = gk_malloc(16384 * 4 * 64), *y = gk_malloc((size_t)154880 * 4 * 2);
  gk_fill_random(x, 16384 * 4 * 64, 3);
  printf("\n[1] gk_matmul n = 1: us per call | GB/s | %% of copy bw (%.0f GB/s)\n", g_bw);
  printf("%-7s %-6s %13s | %-24s | %-24s | %-24s | %-24s | %s\n", "format", "group", "shape", "v3 (new)", "v3 unpipelined", "old default", "v1", "v3 vs v1");
  for (int f = 0; f < nfmt; f++)
    for (int s = 0; s < nshape; s++) {
      const int fmt = fmts[f][0], rows = shapes[s][0], cols = shapes[s][1];
      if (fmt == WMAT_F32 && rows > 12288) continue;
      if (f >= 3 && rows != 2048 && rows != 12288) continue; /* other groups: two shapes */
      gpu_mat W0 = new_mat(fmt, rows, cols, fmts[f][1] ? fmts[f][1] : 32, fmts[f][2], 11 + s);
      size_t nb = mat_bytes(&W0);
      int nc = copies_for(nb);
      gpu_mat *W = xmalloc(nc * sizeof *W);
      W[0] = W0;
      for (int c = 1; c < nc; c++) W[c] = new_mat(fmt, rows, cols, W0.group, W0.scale_bf16, 11 + s + 100 * c);
      job j = {.kind = 0, .W = W, .ncopy = nc, .x = x, .n = 1, .ldx = cols, .y = y, .ldy = rows};
      double us[4];
      float *out[4];
      static const int ver[4] = {3, 4, 0, 1};
      for (int v = 0; v < 4; v++) {
        int vv = ver[v] ? ver[v] : fmt >= WMAT_Q8 ? 1 : 2;
        gk_set_gemv_version(vv);
        us[v] = time_job(&j, reps_for(nc));
        gk_matmul(&W[0], x, 1, cols, y, rows);
        out[v] = d2h_f(y, rows);
      }
      gk_set_gemv_version(0);
      double e = rel(out[0], out[3], rows), e2 = rel(out[2], out[3], rows);
      int ok = e <= 1e-5 && e2 <= 1e-5 && !memcmp(out[0], out[1], (size_t)rows * 4);
      g_fail += !ok;
      char nm[32];
      snprintf(nm, sizeof nm, "%dx%d", rows, cols);
      printf("%-7s %-6d %13s |", fmt_name(fmt, W0.scale_bf16), fmt >= WMAT_Q8 ? W0.group : 0, nm);
      for (int v = 0; v < 4; v++) printf(" %7.1f %6.0f %5.1f%% |", us[v], nb / us[v] / 1e3, 100.0 * nb / us[v] / 1e3 / g_bw);
      printf(" %.1e %s\n", e, ok ? "ok" : "MISMATCH");
      for (int v = 0; v < 4; v++) free(out[v]);
      for (int c = 0; c < nc; c++) gk_free((void *)W[c].d);
      free(W);
    }
  gk_free(x); gk_free(y);
}

/* table 2: routed experts, one token, 8 pairs (distinct experts), gate
 * (2048 x 4096, x per token) and down (4096 x 2048, x per pair) */
static void experts(int quick) {
  enum { E = 32, K = 8, ROT = E / K };
  static const int fmts[][3] = {{WMAT_BF16, 0, 1}, {WMAT_Q4, 32, 1}, {WMAT_Q8, 32, 1}, {WMAT_Q4, 128, 0}};
  const int nfmt = quick ? 3 : 4;
  float *x = gk_malloc(4096 * 4 * K), *y = gk_malloc(4096 * 4 * K);
  gk_fill_random(x, 4096 * 4 * K, 9);
  int *idx[ROT];
  for (int r = 0; r < ROT; r++) {
    int h[K];
    for (int i = 0; i < K; i++) h[i] = r * K + i;
    idx[r] = gk_malloc(sizeof h);
    gk_h2d(idx[r], h, sizeof h);
  }
  printf("\n[2] gk_matmul_experts, 1 token x %d pairs (experts cycled over %d): us per call | GB/s | %% of copy bw\n", K, E);
  printf("%-7s %-6s %-22s | %-24s | %-24s | %-24s | %-24s | %s\n", "format", "group", "projection", "v3 (new)", "v3 unpipelined", "old default", "v1", "v3 vs v1");
  for (int f = 0; f < nfmt; f++) {
    const int fmt = fmts[f][0];
    gpu_mat h[E * 3];
    for (int e = 0; e < E; e++)
      for (int w = 0; w < 3; w++)
        h[e * 3 + w] = new_mat(fmt, w < 2 ? 2048 : 4096, w < 2 ? 4096 : 2048, fmts[f][1] ? fmts[f][1] : 32, fmts[f][2], 1000 + e * 3 + w);
    gpu_mat *dset = gk_malloc(sizeof h);
    gk_h2d(dset, h, sizeof h);
    for (int w = 0; w < 3; w += 2) {
      const int rows = h[w].rows, cols = h[w].cols;
      size_t nb = K * mat_bytes(&h[w]);
      job j = {.kind = 1, .dset = dset, .which = w, .fmt = fmt, .rows = rows, .cols = cols, .idx = (const int *const *)idx,
               .nidx = ROT, .npairs = K, .k = K, .xpt = w < 2, .x = x, .ldx = cols, .y = y, .ldy = rows};
      double us[4];
      float *out[4];
      static const int ver[4] = {3, 4, 0, 1};
      for (int v = 0; v < 4; v++) {
        gk_set_gemv_version(ver[v] ? ver[v] : fmt >= WMAT_Q8 ? 1 : 2);
        us[v] = time_job(&j, 2 * ROT);
        launch(&j, 0);
        out[v] = d2h_f(y, (size_t)K * rows);
      }
      gk_set_gemv_version(0);
      double e = rel(out[0], out[3], (size_t)K * rows);
      int ok = e <= 1e-5 && !memcmp(out[0], out[1], (size_t)K * rows * 4);
      g_fail += !ok;
      char nm[48];
      snprintf(nm, sizeof nm, "%s %dx%d", w ? "down" : "gate", rows, cols);
      printf("%-7s %-6d %-22s |", fmt_name(fmt, h[0].scale_bf16), fmt >= WMAT_Q8 ? h[0].group : 0, nm);
      for (int v = 0; v < 4; v++) printf(" %7.1f %6.0f %5.1f%% |", us[v], nb / us[v] / 1e3, 100.0 * nb / us[v] / 1e3 / g_bw);
      printf(" %.1e %s\n", e, ok ? "ok" : "MISMATCH");
      for (int v = 0; v < 4; v++) free(out[v]);
    }
    for (int e = 0; e < E * 3; e++) gk_free((void *)h[e].d);
    gk_free(dset);
  }
  for (int r = 0; r < ROT; r++) gk_free(idx[r]);
  gk_free(x); gk_free(y);
}

/* table 3: n tokens, v3 GEMV vs the cuBLAS path */
static void tokens(int quick) {
  static const int shapes[][2] = {{2048, 4096}, {8192, 4096}, {4096, 8192}};
  static const int fmts[] = {WMAT_BF16, WMAT_Q4, WMAT_Q8};
  static const int ns[] = {1, 2, 3, 4, 5, 8, 9, 16, 24, 32, 48, 64};
  const int nshape = quick ? 2 : 3, nn = sizeof ns / sizeof *ns;
  float *x = gk_malloc((size_t)64 * 8192 * 4), *y = gk_malloc((size_t)64 * 8192 * 4);
  gk_fill_random(x, (size_t)64 * 8192 * 4, 21);
  printf("\n[3] n tokens: v3 GEMV vs cuBLAS path (us per call; weight GB/s in brackets); bits: token 0 and n-1 vs n = 1\n");
  for (int f = 0; f < 3; f++)
    for (int s = 0; s < nshape; s++) {
      const int fmt = fmts[f], rows = shapes[s][0], cols = shapes[s][1];
      gpu_mat W0 = new_mat(fmt, rows, cols, 32, 1, 77 + s);
      size_t nb = mat_bytes(&W0);
      int nc = copies_for(nb);
      gpu_mat *W = xmalloc(nc * sizeof *W);
      W[0] = W0;
      for (int c = 1; c < nc; c++) W[c] = new_mat(fmt, rows, cols, 32, 1, 77 + s + 100 * c);
      /* n = 1 results of every token, for the bitwise checks */
      gk_set_gemm_min(1 << 30);
      float *one = xmalloc((size_t)64 * rows * sizeof(float));
      for (int t = 0; t < 64; t++) {
        gk_matmul(&W[0], x + (size_t)t * cols, 1, cols, y, rows);
        gk_d2h(one + (size_t)t * rows, y, (size_t)rows * 4);
      }
      printf("%-5s %6dx%-5d gemv:", fmt_name(fmt, 1), rows, cols);
      int cross = 0, bits_ok = 1;
      double ug[16], uc[16];
      for (int i = 0; i < nn; i++) {
        const int n = ns[i];
        job j = {.kind = 0, .W = W, .ncopy = nc, .x = x, .n = n, .ldx = cols, .y = y, .ldy = rows};
        gk_set_gemm_min(1 << 30);
        ug[i] = time_job(&j, reps_for(nc));
        gk_matmul(&W[0], x, n, cols, y, rows);
        float *o = d2h_f(y, (size_t)n * rows);
        bits_ok &= !memcmp(o, one, (size_t)rows * 4) && !memcmp(o + (size_t)(n - 1) * rows, one + (size_t)(n - 1) * rows, (size_t)rows * 4);
        free(o);
        uc[i] = 0;
        if (fmt == WMAT_BF16 || n == 1 || n == 8 || n == 32 || n == 64) {
          gk_set_gemm_min(1);
          uc[i] = time_job(&j, reps_for(nc));
        }
        printf(" n%d %.1f(%.0f)", n, ug[i], nb / ug[i] / 1e3);
      }
      printf("\n%-5s %6dx%-5d blas:", "", rows, cols);
      for (int i = 0; i < nn; i++) {
        if (uc[i] <= 0) continue;
        printf(" n%d %.1f", ns[i], uc[i]);
        if (!cross && uc[i] < ug[i]) cross = ns[i];
      }
      g_fail += !bits_ok;
      if (cross) printf("\n      -> cuBLAS faster from n = %d; ", cross);
      else printf("\n      -> GEMV faster up to n = 64; ");
      printf("token bits independent of n: %s\n", bits_ok ? "yes" : "NO");
      gk_set_gemm_min(0);
      free(one);
      for (int c = 0; c < nc; c++) gk_free((void *)W[c].d);
      free(W);
    }
  gk_free(x); gk_free(y);
}

/* table 4: the split-K target (bench knob; changes the bits, not the
 * correctness), n = 1, v3 */
static void split_sweep(void) {
  static const int shapes[][2] = {{2048, 4096}, {4096, 2048}, {8192, 4096}, {4096, 8192}, {12288, 4096}, {128, 4096}};
  static const int fmts[] = {WMAT_BF16, WMAT_Q4, WMAT_Q8};
  static const int tw[] = {512, 1024, 2048, 4096, 8192, 16384};
  float *x = gk_malloc(8192 * 4), *y = gk_malloc(12288 * 4);
  gk_fill_random(x, 8192 * 4, 5);
  printf("\n[4] v3 n = 1 by split-K target warps (us per call):");
  for (size_t i = 0; i < sizeof tw / sizeof *tw; i++) printf(" %7d", tw[i]);
  printf("\n");
  for (int f = 0; f < 3; f++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      const int rows = shapes[s][0], cols = shapes[s][1];
      gpu_mat W0 = new_mat(fmts[f], rows, cols, 32, 1, 300 + s);
      size_t nb = mat_bytes(&W0);
      int nc = copies_for(nb);
      gpu_mat *W = xmalloc(nc * sizeof *W);
      W[0] = W0;
      for (int c = 1; c < nc; c++) W[c] = new_mat(fmts[f], rows, cols, 32, 1, 300 + s + 100 * c);
      job j = {.kind = 0, .W = W, .ncopy = nc, .x = x, .n = 1, .ldx = cols, .y = y, .ldy = rows};
      printf("%-5s %6dx%-5d                                 ", fmt_name(fmts[f], 1), rows, cols);
      for (size_t i = 0; i < sizeof tw / sizeof *tw; i++) {
        gk_set_gemv_split_target(tw[i]);
        double us = time_job(&j, reps_for(nc));
        printf(" %7.1f", us);
      }
      printf("\n");
      gk_set_gemv_split_target(0);
      for (int c = 0; c < nc; c++) gk_free((void *)W[c].d);
      free(W);
    }
  gk_free(x); gk_free(y);
}

int main(int argc, char **argv) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) {
    printf("SKIP: no GPU device (%s)\n", why);
    return 0;
  }
  const int quick = argc > 1 && !strcmp(argv[1], "quick");
  printf("device: %s\n", glm53_gpu_device_desc());
  g_bw = gk_time_d2d_gbs((size_t)2 << 30, 20);
  printf("D2D copy (read+write, 2 GiB x 20): %.0f GB/s\n", g_bw);
  double t0 = now_sec();
  shapes_n1(quick);
  experts(quick);
  tokens(quick);
  if (!quick) split_sweep();
  printf("\ngpu_gemv: %s (%.1f s)\n", g_fail ? "CHECKS FAILED" : "all checks ok", now_sec() - t0);
  return g_fail ? 1 : 0;
}
