/* chat_render_json: OpenAI-style JSON (template kwargs) -> chat_request. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_json.h"

static const char *str_or_null(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The template's visible_text for a content list; NULL for non-lists. */
static char *flatten_content(const cJSON *c) {
  if (!cJSON_IsArray(c)) return NULL;
  chat_sb b = {0};
  sb_put(&b, "", 0);
  const cJSON *it;
  cJSON_ArrayForEach(it, c) {
    if (cJSON_IsString(it)) { sb_puts(&b, it->valuestring); continue; }
    const char *ty = str_or_null(it, "type");
    if (!ty) continue;
    if (!strcmp(ty, "text")) sb_puts(&b, str_or_null(it, "text") ? str_or_null(it, "text") : "");
    else if (!strcmp(ty, "image") || !strcmp(ty, "image_url")) sb_puts(&b, "<|begin_of_image|><|image|><|end_of_image|>");
    else if (!strcmp(ty, "video") || !strcmp(ty, "video_url")) sb_puts(&b, "<|begin_of_video|><|video|><|end_of_video|>");
    else if (!strcmp(ty, "audio") || !strcmp(ty, "audio_url") || !strcmp(ty, "input_audio"))
      sb_puts(&b, "<|begin_of_audio|><|end_of_audio|>");
  }
  return b.p;
}

char *chat_render_json(const char *kwargs_json) {
  cJSON *root = kwargs_json ? cJSON_Parse(kwargs_json) : NULL;
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    glm53_err("chat: request is not a JSON object");
    return NULL;
  }
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
  chat_message *m = xcalloc((size_t)n + 1, sizeof *m);
  char **owned = xcalloc((size_t)n * 64 + 8, sizeof(char *)); /* strings we print */
  size_t n_owned = 0, owned_cap = (size_t)n * 64 + 8;
  char *out = NULL;
  int i = 0, bad = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, msgs) {
    chat_message *mm = &m[i++];
    mm->role = str_or_null(e, "role");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    mm->content = cJSON_IsString(c) ? c->valuestring : NULL;
    if (cJSON_IsArray(c)) mm->content = owned[n_owned++] = flatten_content(c);
    mm->reasoning_content = str_or_null(e, "reasoning_content");
    mm->tool_call_id = str_or_null(e, "tool_call_id");
    if (!mm->tool_call_id) mm->tool_call_id = str_or_null(e, "id");
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(e, "tool_calls");
    int nt = cJSON_IsArray(tcs) ? cJSON_GetArraySize(tcs) : 0;
    if (nt > 0) {
      chat_tool_call *tc = xcalloc((size_t)nt, sizeof *tc);
      owned[n_owned++] = (char *)tc;
      int k = 0;
      const cJSON *t;
      cJSON_ArrayForEach(t, tcs) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *src = cJSON_IsObject(f) ? f : t;
        tc[k].id = str_or_null(t, "id");
        if (!tc[k].id) tc[k].id = str_or_null(t, "tool_call_id");
        tc[k].name = str_or_null(src, "name");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(src, "arguments");
        if (cJSON_IsString(a)) tc[k].arguments_json = a->valuestring;
        else if (cJSON_IsObject(a)) tc[k].arguments_json = owned[n_owned++] = cJSON_PrintUnformatted(a);
        else { bad = 1; glm53_err("chat: tool call arguments must be an object"); }
        if (n_owned + 4 > owned_cap) { owned_cap *= 2; owned = xrealloc(owned, owned_cap * sizeof(char *)); }
        k++;
      }
      mm->tool_calls = tc;
      mm->n_tool_calls = nt;
    }
    if (n_owned + 4 > owned_cap) { owned_cap *= 2; owned = xrealloc(owned, owned_cap * sizeof(char *)); }
  }
  if (!bad) {
    chat_request r = {0};
    r.messages = m;
    r.n_messages = n;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    char *tj = (tools && !cJSON_IsNull(tools)) ? cJSON_PrintUnformatted(tools) : NULL;
    r.tools_json = tj;
    r.reasoning_effort = str_or_null(root, "reasoning_effort");
    r.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt"));
    r.clear_thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "clear_thinking"));
    out = chat_render(&r);
    free(tj);
  }
  for (size_t k = 0; k < n_owned; k++) free(owned[k]);
  free(owned);
  free(m);
  cJSON_Delete(root);
  return out;
}
