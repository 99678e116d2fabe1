/* Native renderer of the official GLM-5.3 chat template
 * (shared/data/glm5/chat_template.jinja, sha256 0c4099f3...). Each block below
 * names the template part it mirrors; tests compare byte for byte with
 * Jinja renders (tests/unit/test_chat.c, tests/integration/test_chat_template.sh).
 * Only string contents are supported (no multimodal content lists). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_json.h"

static const char TOOLS_HEAD[] =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
static const char TOOLS_TAIL[] =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

/* Jinja truthiness of a JSON value (defer_loading). */
static int json_truthy(const cJSON *v) {
  if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
  if (cJSON_IsNumber(v)) return v->valuedouble != 0;
  if (cJSON_IsString(v)) return v->valuestring[0] != 0;
  if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
  return 1;
}

/* macro tool_to_json: {"k": tojson(v), ...} without defer_loading / strict. */
static void tool_to_json(chat_sb *b, const cJSON *tool) {
  const cJSON *e;
  int first = 1;
  sb_put(b, "{", 1);
  cJSON_ArrayForEach(e, tool) {
    if (!strcmp(e->string, "defer_loading") || !strcmp(e->string, "strict")) continue;
    if (!first) sb_put(b, ", ", 2);
    first = 0;
    sb_put(b, "\"", 1);
    sb_puts(b, e->string); /* the template writes the key unescaped */
    sb_put(b, "\": ", 3);
    sb_pyjson(b, e);
  }
  sb_put(b, "}", 1);
}

static int render_tools(chat_sb *b, const char *tools_json) {
  if (!tools_json) return 0;
  cJSON *tools = cJSON_Parse(tools_json);
  if (!tools || !cJSON_IsArray(tools)) {
    cJSON_Delete(tools);
    return glm53_err("chat: tools is not a JSON array");
  }
  if (!tools->child) { cJSON_Delete(tools); return 0; } /* `if tools`: empty list renders nothing */
  sb_puts(b, TOOLS_HEAD);
  const cJSON *it;
  cJSON_ArrayForEach(it, tools) {
    if (!cJSON_IsObject(it)) { cJSON_Delete(tools); return glm53_err("chat: a tool is not a JSON object"); }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
    const cJSON *t = f ? f : it; /* `if 'function' in tool`: use the inner object */
    if (!cJSON_IsObject(t)) { cJSON_Delete(tools); return glm53_err("chat: tool.function is not an object"); }
    if (json_truthy(cJSON_GetObjectItemCaseSensitive(t, "defer_loading"))) continue;
    tool_to_json(b, t);
    sb_put(b, "\n", 1);
  }
  sb_puts(b, TOOLS_TAIL);
  cJSON_Delete(tools);
  return 0;
}

static const char *find_sub(const char *s, size_t n, const char *pat) {
  size_t pl = strlen(pat);
  for (size_t i = 0; i + pl <= n; i++)
    if (!memcmp(s + i, pat, pl)) return s + i;
  return NULL;
}
static const char *rfind_sub(const char *s, size_t n, const char *pat) {
  size_t pl = strlen(pat);
  for (size_t i = n >= pl ? n - pl + 1 : 0; i-- > 0;)
    if (!memcmp(s + i, pat, pl)) return s + i;
  return NULL;
}

static int render_assistant(chat_sb *b, const chat_message *m, int show_reasoning) {
  sb_puts(b, "<|assistant|>");
  const char *content = m->content ? m->content : "";
  size_t clen = strlen(content);
  const char *rs = NULL;
  size_t rlen = 0;
  if (m->reasoning_content) {
    rs = m->reasoning_content;
    rlen = strlen(rs);
  } else if (find_sub(content, clen, "</think>")) {
    /* content.split('</think>')[0].split('<think>')[-1]; content.split('</think>')[-1] */
    const char *end = find_sub(content, clen, "</think>");
    size_t hl = (size_t)(end - content);
    const char *open = rfind_sub(content, hl, "<think>");
    rs = open ? open + 7 : content;
    rlen = (size_t)(end - rs);
    const char *last = rfind_sub(content, clen, "</think>") + 8;
    clen -= (size_t)(last - content);
    content = last;
  }
  if (show_reasoning && rs) {
    sb_puts(b, "<think>");
    sb_put(b, rs, rlen);
    sb_puts(b, "</think>");
  } else {
    sb_puts(b, "<think></think>");
  }
  size_t cb, ce;
  py_strip(content, clen, &cb, &ce);
  sb_put(b, content + cb, ce - cb);
  for (int i = 0; i < m->n_tool_calls; i++) {
    const chat_tool_call *tc = &m->tool_calls[i];
    cJSON *args = cJSON_Parse(tc->arguments_json ? tc->arguments_json : "{}");
    if (!cJSON_IsObject(args)) {
      cJSON_Delete(args);
      return glm53_err("chat: arguments of tool call %s are not a JSON object", tc->name ? tc->name : "?");
    }
    sb_puts(b, "<tool_call>");
    sb_puts(b, tc->name ? tc->name : "");
    const cJSON *e;
    cJSON_ArrayForEach(e, args) {
      sb_puts(b, "<arg_key>");
      sb_puts(b, e->string);
      sb_puts(b, "</arg_key><arg_value>");
      if (cJSON_IsString(e)) sb_puts(b, e->valuestring);
      else sb_pyjson(b, e);
      sb_puts(b, "</arg_value>");
    }
    sb_puts(b, "</tool_call>");
    cJSON_Delete(args);
  }
  return 0;
}

static const char *id_or_null(const char *s) { return s && *s ? s : NULL; }

static void tool_response(chat_sb *b, const chat_message *m) {
  sb_puts(b, "<tool_response>");
  sb_puts(b, m->content ? m->content : "");
  sb_puts(b, "</tool_response>");
}

/* A run of tool messages [lo, hi]: one <|observation|>, then the results in
 * the order of the preceding assistant's tool calls when every id matches
 * uniquely (the template's can_sort), else in message order. */
static void render_tool_block(chat_sb *b, const chat_request *r, int lo, int hi) {
  sb_puts(b, "<|observation|>");
  const chat_message *a = lo > 0 ? &r->messages[lo - 1] : NULL;
  int can_sort = a && !strcmp(a->role, "assistant") && a->n_tool_calls > 0;
  for (int k = lo; k <= hi && can_sort; k++) {
    const char *id = id_or_null(r->messages[k].tool_call_id);
    if (!id) { can_sort = 0; break; }
    int dup = 0, found = 0;
    for (int j = lo; j <= hi; j++)
      if (id_or_null(r->messages[j].tool_call_id) && !strcmp(r->messages[j].tool_call_id, id)) dup++;
    for (int i = 0; i < a->n_tool_calls; i++)
      if (id_or_null(a->tool_calls[i].id) && !strcmp(a->tool_calls[i].id, id)) found = 1;
    if (dup > 1 || !found) can_sort = 0;
  }
  for (int i = 0; i < (a ? a->n_tool_calls : 0) && can_sort; i++) {
    const char *id = id_or_null(a->tool_calls[i].id);
    if (!id) { can_sort = 0; break; }
    for (int j = i + 1; j < a->n_tool_calls; j++)
      if (id_or_null(a->tool_calls[j].id) && !strcmp(a->tool_calls[j].id, id)) can_sort = 0;
  }
  if (can_sort) {
    for (int i = 0; i < a->n_tool_calls; i++)
      for (int k = lo; k <= hi; k++)
        if (!strcmp(r->messages[k].tool_call_id, a->tool_calls[i].id)) tool_response(b, &r->messages[k]);
  } else {
    for (int k = lo; k <= hi; k++) tool_response(b, &r->messages[k]);
  }
}

char *chat_render(const chat_request *r) {
  if (!r || (r->n_messages > 0 && !r->messages) || r->n_messages < 0) {
    glm53_err("chat: invalid request");
    return NULL;
  }
  for (int i = 0; i < r->n_messages; i++) {
    const char *role = r->messages[i].role;
    if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))) {
      glm53_err("chat: message %d has unknown role '%s'", i, role ? role : "(null)");
      return NULL;
    }
    if (r->messages[i].n_tool_calls < 0 || (r->messages[i].n_tool_calls > 0 && !r->messages[i].tool_calls)) {
      glm53_err("chat: message %d has bad tool_calls", i);
      return NULL;
    }
  }
  chat_sb b = {0};
  sb_puts(&b, "[gMASK]<sop><|system|>Reasoning Effort: ");
  const char *eff = r->reasoning_effort;
  sb_puts(&b, eff && !strcmp(eff, "low") ? "Low" : eff && !strcmp(eff, "high") ? "High" : "Max");
  if (render_tools(&b, r->tools_json)) { free(b.p); return NULL; }
  int last_user = -1;
  for (int i = 0; i < r->n_messages; i++)
    if (!strcmp(r->messages[i].role, "user")) last_user = i;
  for (int i = 0; i < r->n_messages; i++) {
    const chat_message *m = &r->messages[i];
    if (!strcmp(m->role, "user") || !strcmp(m->role, "system")) {
      sb_puts(&b, m->role[0] == 'u' ? "<|user|>" : "<|system|>");
      sb_puts(&b, m->content ? m->content : "");
    } else if (!strcmp(m->role, "assistant")) {
      if (render_assistant(&b, m, !r->clear_thinking || i > last_user)) { free(b.p); return NULL; }
    } else if (i == 0 || strcmp(r->messages[i - 1].role, "tool")) { /* first of a tool run */
      int hi = i;
      while (hi + 1 < r->n_messages && !strcmp(r->messages[hi + 1].role, "tool")) hi++;
      render_tool_block(&b, r, i, hi);
    }
  }
  if (r->add_generation_prompt) sb_puts(&b, "<|assistant|><think>");
  return b.p;
}
