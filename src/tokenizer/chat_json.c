/* String builder, Python-style JSON dump and Python str.strip() semantics for
 * the chat renderer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/tok_internal.h"

void sb_put(chat_sb *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2 + 64;
    b->p = xrealloc(b->p, b->cap);
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void sb_puts(chat_sb *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_pystr(chat_sb *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    switch (*p) {
    case '"': sb_put(b, "\\\"", 2); break;
    case '\\': sb_put(b, "\\\\", 2); break;
    case '\n': sb_put(b, "\\n", 2); break;
    case '\r': sb_put(b, "\\r", 2); break;
    case '\t': sb_put(b, "\\t", 2); break;
    case '\b': sb_put(b, "\\b", 2); break;
    case '\f': sb_put(b, "\\f", 2); break;
    default:
      if (*p < 0x20) {
        snprintf(esc, sizeof esc, "\\u%04x", *p);
        sb_puts(b, esc);
      } else {
        sb_put(b, (const char *)p, 1);
      }
    }
  }
  sb_put(b, "\"", 1);
}

/* Python repr() of a float: shortest round-trip digits, exponent form when
 * the exponent is < -4 or >= 16. Integral values below 2^53 print as ints
 * (JSON input cannot tell 2 from 2.0 once parsed; ints are the common case). */
static void sb_pynum(chat_sb *b, double v) {
  char buf[64];
  if (!isfinite(v)) { sb_puts(b, isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity"); return; }
  if (v == floor(v) && fabs(v) < 9007199254740992.0) {
    snprintf(buf, sizeof buf, "%.0f", v);
    sb_puts(b, strcmp(buf, "-0") == 0 ? "-0.0" : buf);
    return;
  }
  int prec;
  for (prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
    if (strtod(buf, NULL) == v) break;
  }
  /* buf = d.ddde[+-]XX -> digits and exponent */
  char digits[32];
  int nd = 0, neg = buf[0] == '-';
  const char *q = buf + neg;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  digits[nd] = 0;
  int exp = atoi(q + 1);
  chat_sb o = {0};
  if (neg) sb_put(&o, "-", 1);
  if (exp < -4 || exp >= 16) {
    sb_put(&o, digits, 1);
    if (nd > 1) { sb_put(&o, ".", 1); sb_put(&o, digits + 1, (size_t)nd - 1); }
    snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    sb_puts(&o, buf);
  } else if (exp < 0) {
    sb_puts(&o, "0.");
    for (int i = 0; i < -exp - 1; i++) sb_put(&o, "0", 1);
    sb_put(&o, digits, (size_t)nd);
  } else {
    for (int i = 0; i <= exp; i++) sb_put(&o, i < nd ? digits + i : "0", 1);
    sb_put(&o, ".", 1);
    if (nd > exp + 1) sb_put(&o, digits + exp + 1, (size_t)(nd - exp - 1));
    else sb_put(&o, "0", 1);
  }
  sb_put(b, o.p, o.n);
  free(o.p);
}

void sb_pyjson(chat_sb *b, const cJSON *v) {
  const cJSON *e;
  int first = 1;
  if (cJSON_IsObject(v)) {
    sb_put(b, "{", 1);
    cJSON_ArrayForEach(e, v) {
      if (!first) sb_put(b, ", ", 2);
      first = 0;
      sb_pystr(b, e->string);
      sb_put(b, ": ", 2);
      sb_pyjson(b, e);
    }
    sb_put(b, "}", 1);
  } else if (cJSON_IsArray(v)) {
    sb_put(b, "[", 1);
    cJSON_ArrayForEach(e, v) {
      if (!first) sb_put(b, ", ", 2);
      first = 0;
      sb_pyjson(b, e);
    }
    sb_put(b, "]", 1);
  } else if (cJSON_IsString(v)) {
    sb_pystr(b, v->valuestring);
  } else if (cJSON_IsNumber(v)) {
    sb_pynum(b, v->valuedouble);
  } else if (cJSON_IsBool(v)) {
    sb_puts(b, cJSON_IsTrue(v) ? "true" : "false");
  } else {
    sb_puts(b, "null");
  }
}

int py_isspace(unsigned c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

void py_strip(const char *s, size_t n, size_t *bp, size_t *ep) {
  const unsigned char *u = (const unsigned char *)s;
  size_t b = 0, e = 0, i = 0;
  int seen = 0;
  while (i < n) {
    int l = utf8_valid_len(u + i, n - i);
    unsigned cp = l ? utf8_cp(u + i, l) : 0xFFFD;
    if (!l) l = 1;
    if (!py_isspace(cp)) {
      if (!seen) { b = i; seen = 1; }
      e = i + (size_t)l;
    }
    i += (size_t)l;
  }
  if (!seen) b = e = 0;
  *bp = b;
  *ep = e;
}
