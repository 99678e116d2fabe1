/* Concise logging to stderr. Level from GLM53_LOG=error|warn|info|debug
 * (default info). Logs say what the engine decided, not what it is doing. */
#ifndef GLM53_CORE_LOG_H
#define GLM53_CORE_LOG_H
#include "core/err.h"

enum { GLM53_LOG_ERROR = 0, GLM53_LOG_WARN, GLM53_LOG_INFO, GLM53_LOG_DEBUG };
void glm53_log(int level, const char *fmt, ...) GLM53_PRINTF(2, 3);
int glm53_log_level(void);
void glm53_log_set_level(int level);
#define LOG_ERROR(...) glm53_log(GLM53_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) glm53_log(GLM53_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) glm53_log(GLM53_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) glm53_log(GLM53_LOG_DEBUG, __VA_ARGS__)

#endif
