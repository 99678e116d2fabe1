#include "core/err.h"
#include <stdio.h>
#include <string.h>

static _Thread_local char g_err[1024];

int glm53_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return -1;
}

int glm53_err_ctx(const char *fmt, ...) {
  char prefix[512], old[sizeof g_err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, g_err, sizeof old);
  size_t n = strlen(prefix);
  if (n > sizeof g_err - 3) n = sizeof g_err - 3;
  memcpy(g_err, prefix, n);
  memcpy(g_err + n, ": ", 2);
  size_t room = sizeof g_err - n - 2;
  size_t m = strnlen(old, room - 1);
  memcpy(g_err + n + 2, old, m);
  g_err[n + 2 + m] = 0;
  return -1;
}

const char *glm53_last_error(void) { return g_err[0] ? g_err : "unknown error"; }
void glm53_err_clear(void) { g_err[0] = 0; }
