#include "model/wmat.h"
#include "core/util.h"
#include "cpu/qmatmul.h"
#include <stdlib.h>

static float scale_at(const wmat *w, size_t i) {
  uint16_t s = ((const uint16_t *)w->scales)[i];
  return w->scale_bf16 ? bf16_to_f32(s) : f16_to_f32(s);
}

/* Dequantize one row: the SIMD kernels (src/cpu) where the shape allows,
 * else the generic loop below (the reference the kernels are tested against). */
void wmat_get_row(const wmat *w, int r, float *out) {
  if (w->fmt != WMAT_F32 && cpu_dequant_row(w, r, out) == 0) return;
  wmat_get_row_generic(w, r, out);
}

void wmat_get_row_generic(const wmat *w, int r, float *out) {
  size_t cols = (size_t)w->cols;
  switch (w->fmt) {
  case WMAT_F32:
    memcpy(out, (const float *)w->data + (size_t)r * cols, cols * sizeof(float));
    break;
  case WMAT_BF16: {
    const uint16_t *p = (const uint16_t *)w->data + (size_t)r * cols;
    for (size_t j = 0; j < cols; j++) out[j] = bf16_to_f32(p[j]);
    break;
  }
  case WMAT_Q8: {
    const int8_t *p = (const int8_t *)w->data + (size_t)r * cols;
    size_t ng = cols / (size_t)w->group;
    for (size_t j = 0; j < cols; j++) out[j] = (float)p[j] * scale_at(w, (size_t)r * ng + j / (size_t)w->group);
    break;
  }
  case WMAT_Q4: {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * cols / 2;
    size_t ng = cols / (size_t)w->group;
    for (size_t j = 0; j < cols; j++) {
      int nib = (j & 1) ? (p[j / 2] >> 4) : (p[j / 2] & 15);
      out[j] = (float)(nib - 8) * scale_at(w, (size_t)r * ng + j / (size_t)w->group);
    }
    break;
  }
  default:
    memset(out, 0, cols * sizeof(float));
  }
}

void wmat_matmul(const wmat *w, const float *x, int n, float *y) {
  const int rows = w->rows, cols = w->cols;
  if (w->fmt == WMAT_F32) {
    const float *W = w->data;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols * n > 65536)
    for (int r = 0; r < rows; r++) {
      const float *wr = W + (size_t)r * cols;
      for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        double acc = 0;
        for (int j = 0; j < cols; j++) acc += (double)wr[j] * xt[j];
        y[(size_t)t * rows + r] = (float)acc;
      }
    }
    return;
  }
  /* quantized/bf16: the optimized kernels (src/cpu) when the shape allows */
  if (cpu_qmatmul(w, x, n, y) == 0) return;
#pragma omp parallel if ((size_t)rows * cols * n > 65536)
  {
    float *row = xmalloc((size_t)cols * sizeof(float));
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
      wmat_get_row(w, r, row);
      for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        double acc = 0;
        for (int j = 0; j < cols; j++) acc += (double)row[j] * xt[j];
        y[(size_t)t * rows + r] = (float)acc;
      }
    }
    free(row);
  }
}

size_t wmat_data_bytes(const wmat *w) {
  size_t n = (size_t)w->rows * w->cols;
  switch (w->fmt) {
  case WMAT_F32: return n * 4;
  case WMAT_BF16: return n * 2;
  case WMAT_Q8: return n;
  case WMAT_Q4: return (n + 1) / 2;
  default: return 0;
  }
}

size_t wmat_scale_bytes(const wmat *w) {
  return (w->fmt == WMAT_Q8 || w->fmt == WMAT_Q4) && w->group > 0 ? (size_t)w->rows * (w->cols / w->group) * 2 : 0;
}

size_t wmat_bytes(const wmat *w) { return wmat_data_bytes(w) + wmat_scale_bytes(w); }

wmat wmat_rows(const wmat *w, int r0, int n) {
  wmat v = *w;
  v.rows = n;
  v.owned = NULL;
  size_t off = (size_t)r0 * w->cols;
  switch (w->fmt) {
  case WMAT_F32: v.data = (const float *)w->data + off; break;
  case WMAT_BF16: v.data = (const uint16_t *)w->data + off; break;
  case WMAT_Q8: v.data = (const int8_t *)w->data + off; break;
  case WMAT_Q4: v.data = (const uint8_t *)w->data + off / 2; break;
  default: break;
  }
  if (v.scales) v.scales = (const uint16_t *)w->scales + off / w->group;
  return v;
}

void wmat_free(wmat *w) {
  free(w->owned);
  memset(w, 0, sizeof *w);
}
