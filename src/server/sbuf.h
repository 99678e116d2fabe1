/* A growable byte buffer for building responses. */
#ifndef GLM53_SERVER_SBUF_H
#define GLM53_SERVER_SBUF_H
#include "core/util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static inline void sbuf_add(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->p = xrealloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static inline void sbuf_adds(sbuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }
static inline void sbuf_free(sbuf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}
/* Drops the first n bytes. */
static inline void sbuf_consume(sbuf *b, size_t n) {
  memmove(b->p, b->p + n, b->n - n);
  b->n -= n;
  if (b->p) b->p[b->n] = 0;
}
#endif
