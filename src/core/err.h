/* Error reporting: functions return NULL / -1 and leave one clear message
 * here (thread-local), which callers print as a single line. */
#ifndef GLM53_CORE_ERR_H
#define GLM53_CORE_ERR_H
#include <stdarg.h>

#if defined(__GNUC__)
#define GLM53_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GLM53_PRINTF(a, b)
#endif

/* Set the thread's last error (printf-style). Always returns -1 so callers can
 * write `return glm53_err("...")`. */
int glm53_err(const char *fmt, ...) GLM53_PRINTF(1, 2);
/* Prepend context to the current error: "ctx: old message". Returns -1. */
int glm53_err_ctx(const char *fmt, ...) GLM53_PRINTF(1, 2);
const char *glm53_last_error(void);
void glm53_err_clear(void);

#endif
