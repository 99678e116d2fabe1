/* Minimal UTF-8 helpers for the tokenizer: strict validation (no overlongs,
 * surrogates or code points above U+10FFFF), decode, encode. */
#include "tokenizer/tok_internal.h"

int utf8_valid_len(const unsigned char *s, size_t n) {
  if (n == 0) return 0;
  unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
    return 4;
  }
  return 0;
}

uint32_t utf8_cp(const unsigned char *s, int len) {
  switch (len) {
  case 1: return s[0];
  case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
  case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
  default:
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
           (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
  }
}

int utf8_put(uint32_t cp, char *o) {
  unsigned char *u = (unsigned char *)o;
  if (cp < 0x80) { u[0] = (unsigned char)cp; return 1; }
  if (cp < 0x800) { u[0] = (unsigned char)(0xC0 | cp >> 6); u[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    u[0] = (unsigned char)(0xE0 | cp >> 12); u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  u[0] = (unsigned char)(0xF0 | cp >> 18); u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Unicode White_Space property (what Rust's char::is_whitespace and the
 * lstrip/rstrip of added tokens use). */
int unicode_is_white_space(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}
