/* Small shared helpers: checked allocation, whole-file reads, bf16/f16
 * conversions, timing. */
#ifndef GLM53_CORE_UTIL_H
#define GLM53_CORE_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

void *xmalloc(size_t n);             /* aborts on OOM: allocation failure is not recoverable here */
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void *aligned_alloc64(size_t n);     /* 64-byte aligned, zeroed; free with free() */
/* Returns freed heap memory to the OS (glibc malloc_trim over every arena);
 * a no-op with other C libraries. For long-lived processes going idle. */
void release_free_memory(void);

/* Reads a whole file; returns NULL and sets the error on failure. Adds a NUL. */
char *read_file(const char *path, size_t *len);
int write_file_atomic(const char *path, const void *data, size_t len);

double now_sec(void);

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* Round-to-nearest-even, NaN preserved (torch semantics). */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);

#endif
