/* Row quantizers of the .g53 format (docs/format.md). Decoding is
 * wmat_get_row (generic) and src/cpu/qmatmul.c (fast). */
#ifndef GLM53_FORMAT_G53_QUANT_H
#define GLM53_FORMAT_G53_QUANT_H
#include <stdint.h>

/* Int4 "fmt=4": per group of `group` inputs one 16-bit scale d (f16, or bf16
 * when scale_bf16), nibble n = clamp(round(x/d) + 8, 0, 15), value (n-8)*d.
 * d = m / -8 where m is the group's value of largest magnitude (so m maps to
 * nibble 0 exactly); two nibbles per byte, low nibble = even column.
 * q: cols/2 bytes, scales: cols/group. cols % group == 0, group even. */
void q4_quantize_row(const float *x, int cols, int group, int scale_bf16, uint8_t *q, uint16_t *scales);
/* Int8: d = amax/127, q = clamp(round(x/d), -127, 127). q: cols bytes. */
void q8_quantize_row(const float *x, int cols, int group, int scale_bf16, int8_t *q, uint16_t *scales);
/* Encodes a 16-bit scale and returns its decoded float (what decoding sees). */
float g53_scale_enc(float d, int scale_bf16, uint16_t *out);

#endif
