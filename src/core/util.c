#include "core/util.h"
#include "core/err.h"
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void oom(size_t n) {
  fprintf(stderr, "glm53 error: out of memory allocating %zu bytes\n", n);
  abort();
}
void *xmalloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) oom(n); return p; }
void *xcalloc(size_t n, size_t sz) { void *p = calloc(n ? n : 1, sz ? sz : 1); if (!p) oom(n * sz); return p; }
void *xrealloc(void *p, size_t n) { p = realloc(p, n ? n : 1); if (!p) oom(n); return p; }
char *xstrdup(const char *s) { size_t n = strlen(s) + 1; char *d = xmalloc(n); memcpy(d, s, n); return d; }
void release_free_memory(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}
void *aligned_alloc64(size_t n) {
  size_t r = (n + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, r ? r : 64);
  if (!p) oom(n);
  memset(p, 0, r ? r : 64);
  return p;
}

char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) { glm53_err("cannot open %s: %s", path, strerror(errno)); return NULL; }
  if (fseek(f, 0, SEEK_END) != 0) { fclose(f); glm53_err("cannot seek %s", path); return NULL; }
  long n = ftell(f);
  if (n < 0) { fclose(f); glm53_err("cannot size %s", path); return NULL; }
  rewind(f);
  char *buf = xmalloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
    fclose(f); free(buf); glm53_err("short read on %s", path); return NULL;
  }
  fclose(f);
  buf[n] = 0;
  if (len) *len = (size_t)n;
  return buf;
}

int write_file_atomic(const char *path, const void *data, size_t len) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return glm53_err("cannot create %s: %s", tmp, strerror(errno));
  const char *p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0) { if (errno == EINTR) continue; close(fd); unlink(tmp); return glm53_err("write %s: %s", tmp, strerror(errno)); }
    p += w; left -= (size_t)w;
  }
  if (fsync(fd) != 0 || close(fd) != 0) { unlink(tmp); return glm53_err("fsync %s: %s", tmp, strerror(errno)); }
  if (rename(tmp, path) != 0) { unlink(tmp); return glm53_err("rename to %s: %s", path, strerror(errno)); }
  return 0;
}

double now_sec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

float f16_to_f32(uint16_t h) {
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  uint32_t s = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* overflow -> inf */
  if (a < 0x38800000u) { /* f16 subnormal (or zero): multiples of 2^-24, round half to even */
    float af; memcpy(&af, &a, 4);
    return (uint16_t)(s | (uint32_t)lrintf(ldexpf(af, 24)));
  }
  uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u;
  return (uint16_t)(s | (r >> 13));
}

/* OCP FP8 E4M3 (fn variant: no inf, 0x7f/0xff are NaN), as torch.float8_e4m3fn. */
float fp8e4m3_to_f32(uint8_t v) {
  uint32_t s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  float r;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) r = ldexpf((float)m, -9);
  else r = ldexpf((float)(8 + m), (int)e - 10);
  return s ? -r : r;
}
