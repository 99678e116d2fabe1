/* Group quantizers: each quantizes against the *rounded* 16-bit scale so the
 * stored nibbles are the best choice for the scale the decoder will use. */
#include "format/g53_quant.h"
#include "core/util.h"
#include <math.h>

float g53_scale_enc(float d, int scale_bf16, uint16_t *out) {
  if (scale_bf16) { *out = f32_to_bf16(d); return bf16_to_f32(*out); }
  *out = f32_to_f16(d);
  return f16_to_f32(*out);
}

void q4_quantize_row(const float *x, int cols, int group, int scale_bf16, uint8_t *q, uint16_t *scales) {
  for (int g0 = 0; g0 < cols; g0 += group) {
    float m = 0;
    for (int j = g0; j < g0 + group; j++) if (fabsf(x[j]) > fabsf(m)) m = x[j];
    float d = g53_scale_enc(m / -8.0f, scale_bf16, &scales[g0 / group]);
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = g0; j < g0 + group; j += 2) {
      int a = (int)lrintf(x[j] * id) + 8, b = (int)lrintf(x[j + 1] * id) + 8;
      a = a < 0 ? 0 : a > 15 ? 15 : a;
      b = b < 0 ? 0 : b > 15 ? 15 : b;
      q[j / 2] = (uint8_t)(a | b << 4);
    }
  }
}

void q8_quantize_row(const float *x, int cols, int group, int scale_bf16, int8_t *q, uint16_t *scales) {
  for (int g0 = 0; g0 < cols; g0 += group) {
    float amax = 0;
    for (int j = g0; j < g0 + group; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = g53_scale_enc(amax / 127.0f, scale_bf16, &scales[g0 / group]);
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = g0; j < g0 + group; j++) {
      int v = (int)lrintf(x[j] * id);
      q[j] = (int8_t)(v < -127 ? -127 : v > 127 ? 127 : v);
    }
  }
}
