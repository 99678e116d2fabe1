/* Parsing a GLM-5.3 assistant output into reasoning, content and tool calls
 * (the <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>
 * format the template teaches). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_json.h"

/* Trimmed copy of s[0..n), or NULL when only white space remains. */
static char *trimmed(const char *s, size_t n) {
  size_t b, e;
  py_strip(s, n, &b, &e);
  if (e <= b) return NULL;
  char *o = xmalloc(e - b + 1);
  memcpy(o, s + b, e - b);
  o[e - b] = 0;
  return o;
}

static const char *find_in(const char *s, const char *end, const char *pat) {
  size_t pl = strlen(pat);
  for (const char *p = s; p + pl <= end; p++)
    if (!memcmp(p, pat, pl)) return p;
  return NULL;
}

/* One call body (between <tool_call> and </tool_call>) -> name + JSON args. */
static int parse_call(const char *s, const char *end, chat_parsed *out) {
  const char *k = find_in(s, end, "<arg_key>");
  char *name = trimmed(s, (size_t)((k ? k : end) - s));
  if (!name) return glm53_err("chat: tool call without a name");
  cJSON *args = cJSON_CreateObject();
  while (k) {
    const char *ke = find_in(k, end, "</arg_key>");
    const char *vs = ke ? find_in(ke, end, "<arg_value>") : NULL;
    const char *ve = vs ? find_in(vs, end, "</arg_value>") : NULL;
    if (!ve) { free(name); cJSON_Delete(args); return glm53_err("chat: malformed tool call arguments"); }
    char *key = trimmed(k + 9, (size_t)(ke - k - 9));
    size_t vl = (size_t)(ve - vs - 11);
    char *val = xmalloc(vl + 1);
    memcpy(val, vs + 11, vl);
    val[vl] = 0;
    /* A value that parses as JSON keeps its type (numbers, objects, ...). */
    cJSON *j = cJSON_ParseWithLength(val, vl);
    if (!j) j = cJSON_CreateString(val);
    cJSON_AddItemToObject(args, key ? key : "", j);
    free(key);
    free(val);
    k = find_in(ve, end, "<arg_key>");
  }
  char *js = cJSON_PrintUnformatted(args);
  cJSON_Delete(args);
  int n = out->n_tool_calls + 1;
  out->tool_names = xrealloc(out->tool_names, (size_t)n * sizeof(char *));
  out->tool_args_json = xrealloc(out->tool_args_json, (size_t)n * sizeof(char *));
  out->tool_names[n - 1] = name;
  out->tool_args_json[n - 1] = xstrdup(js);
  free(js);
  out->n_tool_calls = n;
  return 0;
}

int chat_parse_output(const char *text, chat_parsed *out) {
  memset(out, 0, sizeof *out);
  if (!text) return glm53_err("chat_parse_output: null text");
  const char *end = text + strlen(text);
  const char *think_end = find_in(text, end, "</think>");
  const char *body = text;
  if (think_end) {
    const char *rs = text;
    if (!strncmp(rs, "<think>", 7)) rs += 7;
    out->reasoning = trimmed(rs, (size_t)(think_end - rs));
    body = think_end + 8;
  } else if (!find_in(text, end, "<tool_call>")) {
    /* still thinking (the prompt opened <think>): everything is reasoning */
    const char *rs = !strncmp(text, "<think>", 7) ? text + 7 : text;
    out->reasoning = trimmed(rs, (size_t)(end - rs));
    return 0;
  }
  const char *tc = find_in(body, end, "<tool_call>");
  out->content = trimmed(body, (size_t)((tc ? tc : end) - body));
  while (tc) {
    const char *te = find_in(tc, end, "</tool_call>");
    if (!te) break; /* unfinished call: ignored */
    if (parse_call(tc + 11, te, out)) { chat_parsed_free(out); return -1; }
    tc = find_in(te, end, "<tool_call>");
  }
  return 0;
}

void chat_parsed_free(chat_parsed *p) {
  if (!p) return;
  free(p->reasoning);
  free(p->content);
  for (int i = 0; i < p->n_tool_calls; i++) {
    free(p->tool_names[i]);
    free(p->tool_args_json[i]);
  }
  free(p->tool_names);
  free(p->tool_args_json);
  memset(p, 0, sizeof *p);
}
