#include "core/log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

static int g_level = -1;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

int glm53_log_level(void) {
  if (g_level < 0) {
    const char *e = getenv("GLM53_LOG");
    g_level = GLM53_LOG_INFO;
    if (e) {
      if (!strcmp(e, "error")) g_level = GLM53_LOG_ERROR;
      else if (!strcmp(e, "warn")) g_level = GLM53_LOG_WARN;
      else if (!strcmp(e, "debug")) g_level = GLM53_LOG_DEBUG;
    }
  }
  return g_level;
}

void glm53_log_set_level(int level) { g_level = level; }

void glm53_log(int level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (level > glm53_log_level()) return;
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_log_mu);
  fprintf(stderr, "glm53 %s: ", names[level]);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  pthread_mutex_unlock(&g_log_mu);
  va_end(ap);
}
