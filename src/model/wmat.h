/* A weight matrix W[rows][cols] (PyTorch layout: y = W x) in one of the
 * storage formats. The reference forward only needs products with it, so the
 * format stays behind wmat_matmul(); quantized formats plug in here. */
#ifndef GLM53_MODEL_WMAT_H
#define GLM53_MODEL_WMAT_H
#include <stddef.h>
#include <stdint.h>

enum wmat_fmt {
  WMAT_NONE = 0, /* absent */
  WMAT_F32 = 1,  /* data: float[rows][cols] */
  WMAT_BF16 = 2, /* data: uint16_t[rows][cols] */
  WMAT_Q8 = 3,   /* grouped int8, see docs/format.md */
  WMAT_Q4 = 4,   /* grouped int4 "fmt=4", see docs/format.md */
};

typedef struct {
  int fmt;
  int rows, cols;
  int group;          /* quantization group along cols (Q4/Q8) */
  const void *data;
  const void *scales; /* Q4/Q8: one 16-bit scale per (row, group) */
  int scale_bf16;     /* Q4/Q8: scales are bf16 (1) or f16 (0) */
  void *owned;        /* memory to free with the matrix, if any */
} wmat;

/* Y[n][rows] = X[n][cols] * W^T, fp32 in and out, fp32/fp64 accumulation.
 * Parallel over rows with OpenMP. */
void wmat_matmul(const wmat *w, const float *x, int n, float *y);
/* y = W x for one vector. */
static inline void wmat_matvec(const wmat *w, const float *x, float *y) { wmat_matmul(w, x, 1, y); }
/* Row r of W as fp32 (used for embedding lookups). */
void wmat_get_row(const wmat *w, int r, float *out);
/* The plain-C dequantization (reference for the SIMD kernels' tests). */
void wmat_get_row_generic(const wmat *w, int r, float *out);
size_t wmat_bytes(const wmat *w);       /* data + scales */
size_t wmat_data_bytes(const wmat *w);  /* the weights (Q4: two per byte) */
size_t wmat_scale_bytes(const wmat *w); /* Q4/Q8 group scales, else 0 */
/* Rows [r0, r0+n) of w as a non-owning view (any format; e.g. one head's
 * W_UV block of kv_b, so it can go through wmat_matmul without dequantizing
 * the whole matrix). */
wmat wmat_rows(const wmat *w, int r0, int n);
void wmat_free(wmat *w);

#endif
