/* Helpers shared by chat.c and chat_parse.c: a string builder and JSON
 * output in Python's json.dumps(ensure_ascii=False) style (what the
 * template's tojson filter prints). */
#ifndef GLM53_CHAT_JSON_H
#define GLM53_CHAT_JSON_H
#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct { char *p; size_t n, cap; } chat_sb;
void sb_put(chat_sb *b, const char *s, size_t n);
void sb_puts(chat_sb *b, const char *s);
/* Python json.dumps(v, ensure_ascii=False): ", " and ": " separators. */
void sb_pyjson(chat_sb *b, const cJSON *v);
/* Python str.isspace() for one code point. */
int py_isspace(unsigned cp);
/* Bounds of s without leading/trailing Python white space. */
void py_strip(const char *s, size_t n, size_t *b, size_t *e);

#endif
