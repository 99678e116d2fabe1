/* Startup validation of the device kernels (also the body of the GPU unit
 * tests): each kernel runs on small random non-zero data and is compared with
 * the fp32 CPU reference of src/model/layers.h, or a float64 host loop where
 * the reference has no separate function. Errors are max |gpu - ref| over
 * max |ref|; selections (indexer top-k, router ids) must match exactly. */
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "gpu/gpu_internal.h"
#include "model/layers.h"
#include "model/ops.h"
#include "core/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t s; } srng;
static uint64_t sr_u64(srng *r) {
  r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}
static float sr_f(srng *r) { return (float)((sr_u64(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0); } /* [-1, 1) */
static float *rvec(srng *r, size_t n, float lo, float hi) {
  float *v = xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * 0.5f * (sr_f(r) + 1.0f);
  return v;
}

/* device copies, freed together */
typedef struct { void *p[64]; int n; int bad; } dpool;
static void *dput(dpool *d, const void *h, size_t n) {
  if (d->n == 64) { d->bad = 1; return NULL; }
  void *p = gk_malloc(n ? n : 4);
  if (!p) { d->bad = 1; return NULL; }
  d->p[d->n++] = p;
  if (h && gk_h2d(p, h, n)) d->bad = 1;
  if (!h) gk_memset(p, 0, n);
  return p;
}
static void *dalloc_cb(void *ctx, size_t n) { return dput(ctx, NULL, n); }
static void dfree(dpool *d) {
  for (int i = 0; i < d->n; i++) gk_free(d->p[i]);
  d->n = 0;
}
/* a one-segment batch table (tokens [0, T) at positions pos0..) over one
 * layer's states ls, on the device */
static gk_batch one_seg(dpool *d, const gk_lstate *ls, int T, int pos0) {
  gk_batch b = {0};
  const gk_lstate *dls = dput(d, ls, sizeof *ls);
  gk_seg sg = {.ls = dls, .t0 = 0, .len = T, .pos0 = pos0};
  int *z = xcalloc((size_t)T + 1, sizeof(int));
  b.seg = dput(d, &sg, sizeof sg);
  b.tseg = dput(d, z, (size_t)T * sizeof(int));
  free(z);
  b.nseg = 1;
  b.maxlen = T;
  return b;
}

static double relerr(const float *g, const float *ref, size_t n) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < n; i++) {
    mx = fmax(mx, fabs(ref[i]));
    double e = fabs((double)g[i] - ref[i]);
    if (isnan(g[i])) e = INFINITY;
    d = fmax(d, e);
  }
  return d / fmax(mx, 1e-30);
}

static int add(gpu_check *out, int max, int *n, const char *name, double err, double tol) {
  if (*n < max) {
    snprintf(out[*n].name, sizeof out[*n].name, "%s", name);
    out[*n].err = err; out[*n].tol = tol; out[*n].ok = err <= tol; out[*n].optional = 0;
  }
  (*n)++;
  return 0;
}

/* a host wmat of the format, random values */
static void make_mat(srng *r, wmat *w, int fmt, int rows, int cols) {
  memset(w, 0, sizeof *w);
  w->fmt = fmt; w->rows = rows; w->cols = cols; w->group = 32; w->scale_bf16 = 1;
  size_t n = (size_t)rows * cols;
  if (fmt == WMAT_F32) {
    float *d = rvec(r, n, -1, 1);
    w->data = d; w->owned = d;
  } else if (fmt == WMAT_BF16) {
    uint16_t *d = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(sr_f(r));
    w->data = d; w->owned = d;
  } else {
    size_t nb = fmt == WMAT_Q8 ? n : n / 2, ns = n / w->group;
    uint8_t *d = xmalloc(nb + ns * 2);
    for (size_t i = 0; i < nb; i++) d[i] = (uint8_t)sr_u64(r);
    uint16_t *s = (uint16_t *)(d + nb);
    w->scale_bf16 = fmt == WMAT_Q8; /* one of each scale type */
    for (size_t i = 0; i < ns; i++) {
      float v = 0.01f + 0.02f * (sr_f(r) + 1.0f);
      s[i] = w->scale_bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    w->data = d; w->scales = s; w->owned = d;
  }
}
static gpu_mat dev_mat(dpool *d, const wmat *w) {
  gpu_mat g = {.fmt = w->fmt, .rows = w->rows, .cols = w->cols, .group = w->group, .scale_bf16 = w->scale_bf16};
  size_t n = (size_t)w->rows * w->cols;
  size_t nb = w->fmt == WMAT_F32 ? n * 4 : w->fmt == WMAT_BF16 ? n * 2 : w->fmt == WMAT_Q8 ? n : n / 2;
  g.d = dput(d, w->data, nb);
  if (w->fmt >= WMAT_Q8) g.s = dput(d, w->scales, n / w->group * 2);
  return g;
}

static void check_matmul(srng *r, gpu_check *out, int max, int *k) {
  static const char *fn[] = {"", "f32", "bf16", "q8", "q4"};
  const int saved = gk_gemm_min();
  gk_set_gemm_min(16); /* n = 5 takes the GEMV, n = 19 the cuBLAS path */
  for (int fmt = WMAT_F32; fmt <= WMAT_Q4; fmt++)
    for (int path = 0; path < 2; path++) {
      int rows = 70, cols = fmt >= WMAT_Q8 ? 2048 : (path ? 96 : 2056 + 4 * (fmt == WMAT_F32)); /* split-K, odd, vector */
      int n = path ? 19 : 5;
      wmat w;
      make_mat(r, &w, fmt, rows, cols);
      float *x = rvec(r, (size_t)n * cols, -1, 1), *ref = xmalloc((size_t)n * rows * 4), *got = xmalloc((size_t)n * rows * 4);
      wmat_matmul(&w, x, n, ref);
      dpool d = {0};
      gpu_mat g = dev_mat(&d, &w);
      float *dx = dput(&d, x, (size_t)n * cols * 4), *dy = dput(&d, NULL, (size_t)n * rows * 4);
      double e = INFINITY;
      if (!d.bad && !gk_matmul(&g, dx, n, cols, dy, rows) && !gk_d2h(got, dy, (size_t)n * rows * 4)) e = relerr(got, ref, (size_t)n * rows);
      char name[48];
      snprintf(name, sizeof name, "matmul %s %s n=%d", fn[fmt], path ? "gemm" : "gemv", n);
      /* fp32 accumulation: 1e-5; the cuBLAS path of 16-bit formats rounds activations to bf16 */
      add(out, max, k, name, e, path && fmt != WMAT_F32 ? 2e-2 : 1e-5);
      dfree(&d);
      wmat_free(&w);
      free(x); free(ref); free(got);
    }
  gk_set_gemm_min(saved);
}

static void check_norms(srng *r, gpu_check *out, int max, int *k) {
  const int T = 3, n = 300;
  float *x = rvec(r, T * n, -2, 2), *w = rvec(r, n, 0.5f, 1.5f), *b = rvec(r, n, -0.5f, 0.5f);
  float *ref = xmalloc(T * n * 4), *got = xmalloc(T * n * 4), *u = rvec(r, T * n, -3, 3);
  dpool d = {0};
  float *dx = dput(&d, x, T * n * 4), *dw = dput(&d, w, n * 4), *db = dput(&d, b, n * 4), *dy = dput(&d, NULL, T * n * 4);
  float *du = dput(&d, u, T * n * 4);
  double e1 = INFINITY, e2 = INFINITY, e3 = INFINITY;
  for (int t = 0; t < T; t++) rmsnorm(ref + t * n, x + t * n, w, n, 1e-5f);
  if (!d.bad && !gk_rmsnorm(dy, n, dx, n, dw, T, n, 1e-5f) && !gk_d2h(got, dy, T * n * 4)) e1 = relerr(got, ref, T * n);
  for (int t = 0; t < T; t++) layernorm(ref + t * n, x + t * n, w, b, n, 1e-6f);
  if (!d.bad && !gk_layernorm(dy, n, dx, n, dw, db, T, n, 1e-6f) && !gk_d2h(got, dy, T * n * 4)) e2 = relerr(got, ref, T * n);
  for (int i = 0; i < T * n; i++) ref[i] = swiglu_clamped(x[i], u[i], 1.5f);
  if (!d.bad && !gk_swiglu(dx, du, T * n, 1.5f) && !gk_d2h(got, dx, T * n * 4)) e3 = relerr(got, ref, T * n);
  add(out, max, k, "rmsnorm", e1, 1e-5);
  add(out, max, k, "layernorm", e2, 1e-5);
  add(out, max, k, "swiglu clamped", e3, 1e-5);
  dfree(&d);
  free(x); free(w); free(b); free(ref); free(got); free(u);
}

static void check_mhc(srng *r, gpu_check *out, int max, int *k) {
  glm53_config c = {0};
  c.hc_mult = 4; c.hidden_size = 64; c.hc_sinkhorn_iters = 20; c.hc_eps = 1e-6f; c.rms_norm_eps = 1e-5f;
  const int hc = 4, D = 64, T = 3, mix = (2 + hc) * hc, n = hc * D;
  mhc_weights w = {rvec(r, (size_t)mix * n, -0.05f, 0.05f), rvec(r, mix, -0.5f, 0.5f), rvec(r, 3, 0.8f, 1.2f)};
  float *X = rvec(r, (size_t)T * n, -1, 1), *nw = rvec(r, D, 0.8f, 1.2f), *a = rvec(r, (size_t)T * D, -1, 1);
  float *rX = xmalloc((size_t)T * n * 4), *ry = xmalloc((size_t)T * D * 4), *gX = xmalloc((size_t)T * n * 4), *gy = xmalloc((size_t)T * D * 4);
  memcpy(rX, X, (size_t)T * n * 4);
  for (int t = 0; t < T; t++) {
    float post[16], comb[256];
    mhc_pre(&w, &c, X + t * n, post, comb, ry + t * D);
    rmsnorm(ry + t * D, ry + t * D, nw, D, c.rms_norm_eps);
    mhc_post(&c, a + t * D, post, comb, rX + t * n);
  }
  dpool d = {0};
  gpu_mat fn = {.fmt = WMAT_F32, .rows = mix, .cols = n};
  fn.d = dput(&d, w.fn, (size_t)mix * n * 4);
  float *dX = dput(&d, X, (size_t)T * n * 4), *dmix = dput(&d, NULL, T * mix * 4), *db = dput(&d, w.base, mix * 4);
  float *ds = dput(&d, w.scale, 12), *dnw = dput(&d, nw, D * 4), *dpost = dput(&d, NULL, T * hc * 4);
  float *dcomb = dput(&d, NULL, T * hc * hc * 4), *dy = dput(&d, NULL, T * D * 4), *da = dput(&d, a, T * D * 4);
  double e1 = INFINITY, e2 = INFINITY;
  if (!d.bad && !gk_matmul(&fn, dX, T, n, dmix, mix) &&
      !gk_mhc_pre(dX, dmix, NULL, db, ds, dnw, T, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dpost, dcomb, dy, NULL) &&
      !gk_mhc_post(dX, da, dpost, dcomb, T, hc, D) && !gk_d2h(gy, dy, T * D * 4) && !gk_d2h(gX, dX, (size_t)T * n * 4)) {
    e1 = relerr(gy, ry, (size_t)T * D);
    e2 = relerr(gX, rX, (size_t)T * n);
  }
  add(out, max, k, "mhc pre (rms+proj+sinkhorn+norm)", e1, 1e-4);
  add(out, max, k, "mhc post", e2, 1e-4);
  dfree(&d);
  free(w.fn); free(w.base); free(w.scale); free(X); free(nw); free(a); free(rX); free(ry); free(gX); free(gy);
}

/* conv + l2norm prep + gate + recurrence + gated norm against kda_forward's
 * pieces, written out as kda.c does them */
static void check_kda(srng *r, gpu_check *out, int max, int *k) {
  const int T = 7, H = 2, hd = 40, inner = H * hd, ch = 3 * inner, K = 4;
  float *raw = rvec(r, (size_t)T * ch, -1, 1), *cst = rvec(r, (size_t)(K - 1) * ch, -1, 1), *cw = rvec(r, (size_t)ch * K, -0.5f, 0.5f);
  float *g = rvec(r, (size_t)T * inner, -2, 2), *dtb = rvec(r, inner, -0.5f, 0.5f), *Al = rvec(r, H, -0.5f, 0.5f);
  float *bl = rvec(r, T * H, -2, 2), *z = rvec(r, (size_t)T * inner, -2, 2), *ow = rvec(r, hd, 0.8f, 1.2f);
  float *S0 = rvec(r, (size_t)H * hd * hd, -0.1f, 0.1f);
  /* host reference */
  float *qkv = xmalloc((size_t)T * ch * 4), *gr = xmalloc((size_t)T * inner * 4), *o = xmalloc((size_t)T * inner * 4);
  float *S = xmalloc((size_t)H * hd * hd * 4), *ncs = xmalloc((size_t)(K - 1) * ch * 4);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < ch; j++) {
      double acc = 0;
      for (int tau = 0; tau < K; tau++) {
        int src = t - (K - 1) + tau;
        acc += (double)cw[j * K + tau] * (src >= 0 ? raw[src * ch + j] : cst[(K - 1 + src) * ch + j]);
      }
      qkv[t * ch + j] = siluf_((float)acc);
    }
  for (int s = 0; s < K - 1; s++) memcpy(ncs + s * ch, raw + (T - (K - 1) + s) * ch, ch * 4);
  const float qs = 1.0f / sqrtf((float)hd), lb = -5.0f;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      l2norm(qkv + t * ch + h * hd, hd, 1e-6f);
      for (int i = 0; i < hd; i++) qkv[t * ch + h * hd + i] *= qs;
      l2norm(qkv + t * ch + inner + h * hd, hd, 1e-6f);
      for (int i = 0; i < hd; i++) {
        float x = g[t * inner + h * hd + i] + dtb[h * hd + i];
        gr[t * inner + h * hd + i] = lb * sigmoidf_(expf(Al[h]) * x);
      }
    }
  memcpy(S, S0, (size_t)H * hd * hd * 4);
  for (int h = 0; h < H; h++)
    for (int t = 0; t < T; t++) {
      float *ot = o + t * inner + h * hd;
      kda_step(S + (size_t)h * hd * hd, qkv + t * ch + h * hd, qkv + t * ch + inner + h * hd, qkv + t * ch + 2 * inner + h * hd,
               gr + t * inner + h * hd, sigmoidf_(bl[t * H + h]), hd, hd, ot);
      rmsnorm(ot, ot, ow, hd, 1e-5f);
      for (int i = 0; i < hd; i++) ot[i] *= sigmoidf_(z[t * inner + h * hd + i]);
    }
  /* device: state is [H][dv][dk] */
  float *St = xmalloc((size_t)H * hd * hd * 4), *gS = xmalloc((size_t)H * hd * hd * 4), *go = xmalloc((size_t)T * inner * 4);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < hd; i++)
      for (int j = 0; j < hd; j++) St[((size_t)h * hd + j) * hd + i] = S0[((size_t)h * hd + i) * hd + j];
  dpool d = {0};
  float *draw = dput(&d, raw, (size_t)T * ch * 4), *dcs = dput(&d, cst, (size_t)(K - 1) * ch * 4), *dcw = dput(&d, cw, (size_t)ch * K * 4);
  float *dqkv = dput(&d, NULL, (size_t)T * ch * 4), *dg = dput(&d, g, (size_t)T * inner * 4), *ddt = dput(&d, dtb, inner * 4);
  float *dA = dput(&d, Al, H * 4), *dbl = dput(&d, bl, T * H * 4), *dz = dput(&d, z, (size_t)T * inner * 4);
  float *dow = dput(&d, ow, hd * 4), *dS = dput(&d, St, (size_t)H * hd * hd * 4), *dO = dput(&d, NULL, (size_t)T * inner * 4);
  float *gcs = xmalloc((size_t)(K - 1) * ch * 4);
  double e1 = INFINITY, e2 = INFINITY, e3 = INFINITY;
  gk_lstate ls = {0};
  ls.p[GK_ST_CONV] = dcs;
  ls.p[GK_ST_S] = dS;
  gk_batch b = one_seg(&d, &ls, T, 0);
  if (!d.bad && !gk_kda_conv(draw, &b, dcw, T, ch, K, dqkv) && !gk_kda_prep(dqkv, T, H, hd, qs) &&
      !gk_kda_recur_gated(&b, dqkv, dg, ddt, dA, lb, dbl, T, H, hd, dO) && /* the forward's fused gate */
      !gk_kda_out(dO, dz, dow, T, H, hd, 1e-5f, NULL) && !gk_d2h(go, dO, (size_t)T * inner * 4) &&
      !gk_d2h(gS, dS, (size_t)H * hd * hd * 4) && !gk_d2h(gcs, dcs, (size_t)(K - 1) * ch * 4)) {
    e1 = relerr(go, o, (size_t)T * inner);
    for (int h = 0; h < H; h++)
      for (int i = 0; i < hd; i++)
        for (int j = 0; j < hd; j++) St[((size_t)h * hd + i) * hd + j] = gS[((size_t)h * hd + j) * hd + i];
    e2 = relerr(St, S, (size_t)H * hd * hd);
    e3 = relerr(gcs, ncs, (size_t)(K - 1) * ch);
  }
  add(out, max, k, "kda conv+gates+recurrence+norm", e1, 1e-4);
  add(out, max, k, "kda recurrent state", e2, 1e-4);
  add(out, max, k, "kda conv state", e3, 0);
  dfree(&d);
  free(raw); free(cst); free(cw); free(g); free(dtb); free(Al); free(bl); free(z); free(ow); free(S0);
  free(qkv); free(gr); free(o); free(S); free(ncs); free(St); free(gS); free(go); free(gcs);
}

/* pooled keys, scores and top-k selection of one chunk of queries */
static void check_indexer(srng *r, gpu_check *out, int max, int *k) {
  glm53_config c = {0};
  c.index_n_heads = 4; c.index_head_dim = 64; c.index_kpool = 4; c.index_topk = 16; c.index_kpool_always_select_tail = 1;
  const int nh = 4, hd = 64, P = 4, K = 4, pos0 = 40, T = 6, ctx = pos0 + T, maxpool = ctx / P + 1;
  float *ik = rvec(r, (size_t)ctx * hd, -1, 1), *is = rvec(r, (size_t)ctx * hd, -2, 2), *ape = rvec(r, P * hd, -0.5f, 0.5f);
  float *q = rvec(r, (size_t)T * nh * hd, -1, 1), *w = rvec(r, T * nh, -1, 1);
  float *pool = xmalloc((size_t)maxpool * hd * 4), *score = xmalloc(maxpool * 4), *gscore = xmalloc((size_t)T * maxpool * 4);
  for (int p = 0; p < ctx / P; p++)
    for (int i = 0; i < hd; i++) {
      double z = 0, acc = 0, mx = -INFINITY;
      for (int m = 0; m < P; m++) mx = fmax(mx, is[(p * P + m) * hd + i] + ape[m * hd + i]);
      for (int m = 0; m < P; m++) z += exp(is[(p * P + m) * hd + i] + ape[m * hd + i] - mx);
      for (int m = 0; m < P; m++) acc += exp(is[(p * P + m) * hd + i] + ape[m * hd + i] - mx) / z * ik[(p * P + m) * hd + i];
      pool[p * hd + i] = (float)acc;
    }
  dpool d = {0};
  /* the keys, gate logits and pooled keys paged, 8 rows a page, pages in
   * reverse order (gpu_pages_make) */
  float *bik, *bis, *bpool;
  void *tik = gpu_pages_make(ik, ctx, hd, 3, dalloc_cb, &d, &bik), *tis = gpu_pages_make(is, ctx, hd, 3, dalloc_cb, &d, &bis);
  void *tpool = gpu_pages_make(NULL, maxpool, hd, 3, dalloc_cb, &d, &bpool);
  d.bad |= !tik || !tis || !tpool;
  float *dape = dput(&d, ape, P * hd * 4), *dq = dput(&d, q, (size_t)T * nh * hd * 4), *dw = dput(&d, w, T * nh * 4);
  float *dsc = dput(&d, NULL, (size_t)T * maxpool * 4);
  int *dden = dput(&d, NULL, T * 4), *dnp = dput(&d, NULL, T * 4), *dtail = dput(&d, NULL, T * 4), *dpl = dput(&d, NULL, T * K * 4);
  float *gpool = xmalloc((size_t)maxpool * hd * 4);
  int gden[8], gnp[8], gtail[8], gpl[8 * 4];
  double e1 = INFINITY, e2 = INFINITY, mism = 1;
  /* two chunks: pools closed before pos0, then the chunk's own */
  gk_lstate ls = {0};
  ls.pg[GK_ST_IK] = tik;
  ls.pg[GK_ST_IS] = tis;
  ls.pg[GK_ST_POOL] = tpool;
  ls.pshift = 3;
  gk_batch b0 = one_seg(&d, &ls, pos0, 0), b1 = one_seg(&d, &ls, T, pos0);
  if (!d.bad && !gk_pool_keys(&b0, dape, P, hd) && !gk_pool_keys(&b1, dape, P, hd) &&
      !gk_indexer_scores(dq, dw, &b1, T, P, nh, hd, K, maxpool, dsc) &&
      !gk_select(dsc, &b1, T, P, K, maxpool, 1, dden, dnp, dtail, dpl) && !gpu_pages_read(gpool, bpool, ctx / P, hd, 3) &&
      !gk_d2h(gscore, dsc, (size_t)T * maxpool * 4) && !gk_d2h(gden, dden, T * 4) && !gk_d2h(gnp, dnp, T * 4) &&
      !gk_d2h(gtail, dtail, T * 4) && !gk_d2h(gpl, dpl, T * K * 4)) {
    e1 = relerr(gpool, pool, (size_t)(ctx / P) * hd);
    e2 = 0;
    mism = 0;
    for (int t = 0; t < T; t++) {
      int pos = pos0 + t, n = (pos + 1) / P, sel[4];
      float wt[4];
      for (int h = 0; h < nh; h++) wt[h] = w[t * nh + h] * (1.0f / sqrtf((float)nh));
      indexer_scores(&c, q + (size_t)t * nh * hd, wt, pool, n, score);
      e2 = fmax(e2, relerr(gscore + (size_t)t * maxpool, score, n));
      topk_pools(score, n, K, sel);
      mism += gden[t] != 0 || gnp[t] != K || gtail[t] != n * P;
      for (int i = 0; i < K; i++) mism += gpl[t * K + i] != sel[i];
    }
  }
  add(out, max, k, "indexer pooled keys", e1, 1e-5);
  add(out, max, k, "indexer scores", e2, 1e-5);
  add(out, max, k, "indexer top-k selection (mismatches)", mism, 0);
  dfree(&d);
  free(ik); free(is); free(ape); free(q); free(w); free(pool); free(score); free(gscore); free(gpool);
}

/* float64 attention core of one query at position pos: its selected latent
 * rows (dense: 0..pos; else the np pools' tokens, then the tail from tail
 * to pos), softmax of scale * qt . row, ob[kl] = the weighted row sum
 * (normalised; kl <= 96, at most 64 rows) */
static void ref_attn_core(const double *qt, const float *lat, int kl, int pos, int dense, int np, const int *pools, int P,
                          int tail, double scale, double *ob) {
  int toks[64], n = 0;
  if (dense) for (int j = 0; j <= pos; j++) toks[n++] = j;
  else {
    for (int p = 0; p < np; p++) for (int m = 0; m < P; m++) toks[n++] = pools[p] * P + m;
    for (int j = tail; j <= pos; j++) toks[n++] = j;
  }
  double sc[64], mx = -INFINITY, z = 0;
  for (int j = 0; j < kl; j++) ob[j] = 0;
  for (int s = 0; s < n; s++) {
    double a = 0;
    for (int j = 0; j < kl; j++) a += qt[j] * lat[toks[s] * kl + j];
    sc[s] = a * scale;
    mx = fmax(mx, sc[s]);
  }
  for (int s = 0; s < n; s++) {
    double p = exp(sc[s] - mx);
    z += p;
    for (int j = 0; j < kl; j++) ob[j] += p * lat[toks[s] * kl + j];
  }
  for (int j = 0; j < kl; j++) ob[j] /= z;
}

/* ref[t][h][vd]: the absorbed MLA attention of T queries at positions
 * pos0 + t in float64 from kv_b (W_UK rows, then W_UV rows per head), q
 * (rounded to bf16 first with q_bf16, as the per-head form rounds it) and
 * the latent rows; kl <= 96 */
static void ref_absorbed(const wmat *kvb, const float *q, int q_bf16, const float *lat, int T, int H, int nope, int vd,
                         int kl, int pos0, const int *dense, const int *np, const int *pools, int K, int P,
                         const int *tail, double scale, float *ref) {
  float *row = xmalloc(kl * 4);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      double qt[96], ob[96];
      for (int j = 0; j < kl; j++) qt[j] = 0;
      for (int i = 0; i < nope; i++) {
        const float qi = q[(t * H + h) * nope + i];
        wmat_get_row(kvb, h * (nope + vd) + i, row);
        for (int j = 0; j < kl; j++) qt[j] += (double)row[j] * (q_bf16 ? round_bf16(qi) : qi);
      }
      ref_attn_core(qt, lat, kl, pos0 + t, dense[t], np[t], pools + t * K, P, tail[t], scale, ob);
      for (int i = 0; i < vd; i++) {
        wmat_get_row(kvb, h * (nope + vd) + nope + i, row);
        double a = 0;
        for (int j = 0; j < kl; j++) a += (double)row[j] * ob[j];
        ref[(t * H + h) * vd + i] = (float)a;
      }
    }
  free(row);
}

/* absorbed attention over a sparse selection (pools + tail), float64 loop */
static void check_attn(srng *r, gpu_check *out, int max, int *k) {
  const int H = 3, nope = 24, vd = 20, kl = 96, P = 4, K = 3, pos0 = 29, T = 2, ctx = pos0 + T;
  wmat kvb;
  make_mat(r, &kvb, WMAT_BF16, H * (nope + vd), kl);
  float *q = rvec(r, (size_t)T * H * nope, -1, 1), *lat = rvec(r, (size_t)ctx * kl, -1, 1);
  int dense[2] = {0, 1}, np[2] = {K, 0}, tail[2] = {28, 0}, pools[6] = {5, 0, 3, 0, 0, 0};
  float *ref = xmalloc((size_t)T * H * vd * 4), *got = xmalloc((size_t)T * H * vd * 4);
  const double scale = 1.0 / sqrt((double)nope);
  ref_absorbed(&kvb, q, 0, lat, T, H, nope, vd, kl, pos0, dense, np, pools, K, P, tail, scale, ref);
  dpool d = {0};
  gpu_mat g = dev_mat(&d, &kvb);
  gpu_mla_heads hs;
  int hrc = gpu_build_mla_heads(&kvb, &g, H, nope, vd, dalloc_cb, &d, &hs);
  float *bl, *dq = dput(&d, q, (size_t)T * H * nope * 4), *dO = dput(&d, NULL, (size_t)T * H * vd * 4);
  void *tl = gpu_pages_make(lat, ctx, kl, 2, dalloc_cb, &d, &bl); /* 4 rows a page, reverse order */
  d.bad |= !tl;
  float *dqt = dput(&d, NULL, (size_t)T * H * kl * 4), *dob = dput(&d, NULL, (size_t)T * H * kl * 4);
  float *dpart = dput(&d, NULL, (size_t)T * H * 8 * (kl + 2) * 4);
  int *dd = dput(&d, dense, 8), *dn = dput(&d, np, 8), *dt = dput(&d, tail, 8), *dp = dput(&d, pools, sizeof pools);
  gk_lstate ls = {0};
  ls.pg[GK_ST_LATENT] = tl;
  ls.pshift = 2;
  gk_batch b = one_seg(&d, &ls, T, pos0);
  /* one block per (t, h); parts of 4 rows merged (8 parts cover the
   * selections: 31 rows dense, 14 sparse); 3 parts, whose size (12 and 8
   * rows) then comes from the part count */
  double e[3] = {INFINITY, INFINITY, INFINITY};
  for (int split = 0; split < 3; split++) {
    int chunk = split ? 4 : 0, ns = split == 1 ? 8 : split == 2 ? 3 : 1;
    if (!d.bad && !hrc && !gk_matmul_heads(hs.uk_h, hs.uk_d, H, dq, T, nope, dqt, kl) &&
        !gk_mla_attn(dqt, &b, dd, dn, dt, dp, T, H, kl, P, K, (float)scale, chunk, ns, dpart, dob) &&
        !gk_matmul_heads(hs.uv_h, hs.uv_d, H, dob, T, kl, dO, vd) && !gk_d2h(got, dO, (size_t)T * H * vd * 4))
      e[split] = relerr(got, ref, (size_t)T * H * vd);
  }
  if (!hrc) { free(hs.uk_h); free(hs.uv_h); }
  /* W_UK^T is stored in bf16 (rounded from bf16 kv_b: exact) */
  add(out, max, k, "mla absorbed attention (sparse+dense)", e[0], 1e-5);
  add(out, max, k, "mla attention, 8 parts + merge", e[1], 1e-5);
  add(out, max, k, "mla attention, 3 longer parts + merge", e[2], 1e-5);
  dfree(&d);
  wmat_free(&kvb);
  free(q); free(lat); free(ref); free(got);
}

/* the GEMM form of the attention (gk_mla_attn_gemm) on a chunk whose first
 * tokens select a cache prefix (fewer than K pools complete) and whose later
 * ones select K pools + the tail (gathered), as select_k builds them with
 * always_tail; float64 loop. Returns no check when the build has no BLAS. */
static void check_attn_gemm(srng *r, gpu_check *out, int max, int *k) {
  enum { H = 4, kl = 64, P = 2, K = 3, pos0 = 3, T = 10, ctx = pos0 + T };
  float *qt = rvec(r, (size_t)T * H * kl, -1, 1), *lat = rvec(r, (size_t)ctx * kl, -1, 1);
  int dense[T], np[T], tail[T], pools[T * K];
  for (int t = 0; t < T; t++) {
    int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = n <= K;
    np[t] = n <= K ? n : K;
    tail[t] = n * P;
    static const int off[K] = {0, 1, 3}; /* distinct pools for n >= 4, in no particular order */
    for (int i = 0; i < K; i++) pools[t * K + i] = n <= K ? i : (t + off[i]) % n;
  }
  float *ref = xmalloc((size_t)T * H * kl * 4), *got = xmalloc((size_t)T * H * kl * 4);
  const double scale = 0.125;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      double q64[kl], ob[kl];
      for (int j = 0; j < kl; j++) q64[j] = qt[(t * H + h) * kl + j];
      ref_attn_core(q64, lat, kl, pos0 + t, dense[t], np[t], pools + t * K, P, tail[t], scale, ob);
      for (int j = 0; j < kl; j++) ref[(t * H + h) * kl + j] = (float)ob[j];
    }
  dpool d = {0};
  float *dq = dput(&d, qt, sizeof(float) * T * H * kl), *dl = dput(&d, lat, sizeof(float) * ctx * kl);
  float *dob = dput(&d, NULL, sizeof(float) * T * H * kl);
  int *dd = dput(&d, dense, sizeof dense), *dn = dput(&d, np, sizeof np), *dt = dput(&d, tail, sizeof tail);
  int *dp = dput(&d, pools, sizeof pools);
  const int p0 = pos0;
  int *dp0 = dput(&d, &p0, 4);
  int rc = d.bad ? -1 : gk_mla_attn_gemm(dq, dl, dd, dn, dt, dp, T, dp0, pos0, H, kl, P, K, (float)scale, dob);
  if (rc != 1) { /* 1: not in this build */
    double e = INFINITY;
    if (!rc && !gk_d2h(got, dob, sizeof(float) * T * H * kl)) e = relerr(got, ref, (size_t)T * H * kl);
    add(out, max, k, GPU_CHECK_MLA_GEMM, e, gk_mla_math_tol(gk_mla_math()));
    if (*k <= max) out[*k - 1].optional = 1;
  }
  dfree(&d);
  free(qt); free(lat); free(ref); free(got);
}

/* the per-head (MHA) form of long chunks (gk_mla_mha_gemm: keys and values
 * up-projected through kv_b, the fused attention kernel where the build
 * has it) at the widths its kernel is compiled for in tests (nope 64, vd
 * 32): dense tokens, then K pools + tail; float64 loop of the absorbed
 * math with q rounded to bf16 (as the form rounds it). Optional: a failure
 * turns the form off (the absorbed GEMM form remains). No check when the
 * form does not apply (no BLAS, another MLA arithmetic). */
static void check_attn_mha(srng *r, gpu_check *out, int max, int *k) {
  enum { H = 2, nope = 64, vd = 32, kl = 64, P = 4, K = 3, pos0 = 5, T = 40, ctx = pos0 + T };
  wmat kvb;
  make_mat(r, &kvb, WMAT_BF16, H * (nope + vd), kl);
  float *q = rvec(r, (size_t)T * H * nope, -1, 1), *lat = rvec(r, (size_t)ctx * kl, -1, 1);
  int dense[T], np[T], tail[T], pools[T * K];
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = n <= K;
    np[t] = n <= K ? n : K;
    tail[t] = n * P;
    static const int mo[K] = {0, 3, 1}; /* distinct pools for n > K, in no particular order */
    for (int i = 0; i < K; i++) pools[t * K + i] = n <= K ? i : (t + mo[i]) % n;
  }
  float *ref = xmalloc((size_t)T * H * vd * 4), *got = xmalloc((size_t)T * H * vd * 4);
  const double scale = 1.0 / sqrt((double)nope);
  ref_absorbed(&kvb, q, 1, lat, T, H, nope, vd, kl, pos0, dense, np, pools, K, P, tail, scale, ref);
  dpool d = {0};
  gpu_mat g = dev_mat(&d, &kvb);
  float *dq = dput(&d, q, (size_t)T * H * nope * 4), *dl = dput(&d, lat, (size_t)ctx * kl * 4);
  float *dO = dput(&d, NULL, (size_t)T * H * vd * 4);
  int *dd = dput(&d, dense, sizeof dense), *dn = dput(&d, np, sizeof np), *dt = dput(&d, tail, sizeof tail);
  int *dp = dput(&d, pools, sizeof pools);
  const int p0 = pos0;
  int *dp0 = dput(&d, &p0, 4);
  int rc = d.bad ? -1 : gk_mla_mha_gemm(dq, dl, &g, dd, dn, dt, dp, T, dp0, pos0, H, nope, vd, kl, P, K, (float)scale, dO);
  if (rc != 1) { /* 1: the form does not apply here */
    double e = INFINITY;
    if (!rc && !gk_d2h(got, dO, (size_t)T * H * vd * 4)) e = relerr(got, ref, (size_t)T * H * vd);
    add(out, max, k, GPU_CHECK_MLA_MHA, e, gk_mla_math_tol(GK_MLA_BF16X3));
    if (*k <= max) out[*k - 1].optional = 1;
  }
  dfree(&d);
  wmat_free(&kvb);
  free(q); free(lat); free(ref); free(got);
}

static void check_route(srng *r, gpu_check *out, int max, int *k) {
  glm53_config c = {0};
  c.n_routed_experts = 64; c.num_experts_per_tok = 6; c.n_group = 4; c.topk_group = 2; c.norm_topk_prob = 1;
  c.routed_scaling_factor = 2.5f;
  const int T = 9, E = 64, kk = 6;
  float *lg = rvec(r, (size_t)T * E, -3, 3), *bias = rvec(r, E, -0.1f, 0.1f);
  lg[3] = lg[5]; /* an exact tie: lower index must win */
  int ridx[9 * 6], gidx[9 * 6];
  float rwt[9 * 6], gwt[9 * 6];
  for (int t = 0; t < T; t++) moe_route(&c, lg + t * E, bias, ridx + t * kk, rwt + t * kk);
  dpool d = {0};
  float *dl = dput(&d, lg, (size_t)T * E * 4), *db = dput(&d, bias, E * 4), *dw = dput(&d, NULL, T * kk * 4);
  int *di = dput(&d, NULL, T * kk * 4);
  double mism = 1, e = INFINITY;
  if (!d.bad && !gk_moe_route(dl, db, T, E, kk, c.n_group, c.topk_group, 1, 2.5f, di, dw) && !gk_d2h(gidx, di, sizeof gidx) &&
      !gk_d2h(gwt, dw, sizeof gwt)) {
    mism = 0;
    for (int i = 0; i < T * kk; i++) mism += gidx[i] != ridx[i];
    e = relerr(gwt, rwt, T * kk);
  }
  add(out, max, k, "moe router ids (mismatches)", mism, 0);
  add(out, max, k, "moe router weights", e, 1e-5);
  dfree(&d);
  free(lg); free(bias);
}

int glm53_gpu_selftest(uint64_t seed, gpu_check *out, int max) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) return -1;
  srng r = {seed * 0x9E3779B97F4A7C15ull + 12345};
  int n = 0;
  check_matmul(&r, out, max, &n);
  check_norms(&r, out, max, &n);
  check_mhc(&r, out, max, &n);
  check_kda(&r, out, max, &n);
  check_indexer(&r, out, max, &n);
  check_attn(&r, out, max, &n);
  check_attn_gemm(&r, out, max, &n);
  check_attn_mha(&r, out, max, &n);
  check_route(&r, out, max, &n);
  if (gk_sync()) return -1;
  return n < max ? n : max;
}
